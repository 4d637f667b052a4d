"""Coverage as the coordinator reads it: the condition a deployment carries when its next single loss
would leave an expert with no replica, and the rule that refuses a shrink that would break it.

Both are pure functions of what is stored: the serving generation's coverage (`Deployment.coverage`,
written by the switch from the plan's `engine_agent.layer_coverage.Coverage.record`), the engine
config and the members' failure domains. The failure domain of an engine is its data host
(`Engine.data_host`, else the host of its control URL).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from app.deployments.models import Condition
from engine_agent.placement import slots_per_rank

COVERAGE_AT_RISK = "coverage-at-risk"


def domain_of(data_host: str | None, url: str) -> str:
    """An engine's failure domain: its data host, else its control URL's host."""
    return data_host or urlsplit(url).hostname or url


def coverage_condition(coverage: Mapping[str, Any] | None, *, num_redundant: int = 1) -> Condition | None:
    """`coverage-at-risk` when one engine's (or one domain's) loss would leave an expert with no replica:
    how many, the engine that holds most of them alone, an example, and the domains at risk. Only where
    redundant experts were configured (`num_redundant` > 0): an operator who chose none chose single
    replicas, and a condition there would read as a fault (the coverage figures stay on the record)."""
    if num_redundant <= 0 or not coverage or coverage.get("covered", True):
        return None
    at_risk = int(coverage.get("at_risk") or 0)
    at_risk_domain = coverage.get("at_risk_domain")
    by_engine: Mapping[str, int] = coverage.get("by_engine") or {}
    by_domain: Mapping[str, int] = coverage.get("by_domain") or {}
    layers, experts = int(coverage.get("layers") or 1), int(coverage.get("experts") or 0)
    parts = []
    worst: str | None = None
    if at_risk:
        worst = max(sorted(by_engine), key=lambda engine: by_engine[engine]) if by_engine else None
        parts.append(
            f"{at_risk} of {layers * experts} layer-expert pairs have a single replica"
            + (f"; losing {worst} would leave {by_engine[worst]} of them with none" if worst else "")
            + (f" ({len(by_engine)} engines hold such replicas)" if len(by_engine) > 1 else "")
        )
        example = next(iter(coverage.get("examples") or []), None)
        if example:
            parts.append(
                f"e.g. layer {example['layer']} expert {example['expert']} only on {example['engine']}"
            )
    if at_risk_domain:
        domain = max(sorted(by_domain), key=lambda name: by_domain[name]) if by_domain else None
        parts.append(
            f"{at_risk_domain} pairs sit in one failure domain only"
            + (f"; losing host {domain} would leave {by_domain[domain]} with none" if domain else "")
        )
    since = coverage.get("since")
    return Condition(
        type=COVERAGE_AT_RISK,
        engine_id=worst,
        since=datetime.fromisoformat(since) if isinstance(since, str) else datetime.fromtimestamp(0),
        message=f"generation {coverage.get('generation', '?')}: "
        + "; ".join(parts)
        + ". More redundant experts (or engines on more hosts) would cover them",
    )


def shrink_breaks_coverage(
    coverage: Mapping[str, Any] | None,
    *,
    num_logical: int,
    num_redundant: int,
    target: int,
    survivor_domains: Sequence[str],
) -> str | None:
    """Why shrinking to `target` engines (whose failure domains are `survivor_domains`) would leave an
    expert with a single replica where none has one now; None if it would not, or if the deployment
    is not covered now (nothing to break). Judged on slots and domains: a covered placement needs two
    replicas of every expert on two engines (and two domains, where the engines span several now)."""
    if not coverage or not coverage.get("covered"):
        return None
    if target < 2:
        return "one engine would hold every expert alone (now every expert has two replicas)"
    slots = target * slots_per_rank(num_logical, num_redundant, target)
    if slots < 2 * num_logical:
        return (
            f"{target} engines have {slots} expert slots per layer; two replicas of each of the "
            f"{num_logical} experts need {2 * num_logical}"
        )
    if int(coverage.get("domains") or 1) >= 2 and len(set(survivor_domains)) < 2:
        return (
            f"the engines left would all sit in failure domain {sorted(set(survivor_domains))[0]}: "
            "losing it would lose every expert"
        )
    return None
