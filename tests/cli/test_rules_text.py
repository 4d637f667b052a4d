"""How `epctl deployments show` names a direction's autoscaling rules (pure, a table)."""

from __future__ import annotations

from typing import Any

import pytest

from app.cli.deployment_view import _rules_text

PODS_1 = {"type": "Pods", "value": 1, "period_s": 60.0}
PERCENT_50 = {"type": "Percent", "value": 50, "period_s": 15.0}


@pytest.mark.parametrize(
    ("rules", "shown"),
    [
        pytest.param({}, "window 0 s, HPA's default rate", id="no-limit-is-hpas-default"),
        pytest.param({"max_step": 2, "period_s": 30.0}, "window 0 s, at most 2 per 30 s", id="max-step"),
        pytest.param(
            {"policies": [PERCENT_50]}, "window 0 s, at most 50 % per 15 s", id="one-percent-policy"
        ),
        pytest.param(
            {"max_step": 1, "period_s": 60.0, "policies": [PERCENT_50], "select_policy": "Min"},
            "window 0 s, Min of 1 per 60 s, 50 % per 15 s",
            id="max-step-and-a-policy-by-min",
        ),
        pytest.param(
            {"policies": [PODS_1, PERCENT_50]},
            "window 0 s, Max of 1 per 60 s, 50 % per 15 s",
            id="max-by-default",
        ),
        pytest.param(
            {"policies": [PODS_1], "select_policy": "Disabled"},
            "window 0 s, disabled (select_policy Disabled)",
            id="disabled",
        ),
    ],
)
def test_rules_text(rules: dict[str, Any], shown: str) -> None:
    assert _rules_text({"stabilization_window_s": 0.0, "period_s": 60.0, **rules}) == shown
