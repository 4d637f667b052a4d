"""Inbound hooks never answer 5xx: any JSON body, any mutation of an Alertmanager payload, is a 2xx
or a 4xx."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.operators.alertmanager_payloads import firing_payload
from tests.operators.inbound_hooks.support import post_alerts, signed

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
ALERT_FIELDS = ["status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"]
PAYLOAD_FIELDS = ["version", "groupKey", "status", "receiver", "groupLabels", "commonLabels", "alerts"]


@pytest.mark.databases("sqlite", "postgres")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(["payload", "alert", "label"]), field=st.integers(0, 6), value=JSON)
def test_alertmanager_answers_4xx_or_2xx_to_any_mutated_payload(
    anonymous: TestClient, alertmanager_headers: dict[str, str], d1: str, where: str, field: int, value: Any
) -> None:
    body = firing_payload("d1", scale="up")
    if where == "payload":
        body[PAYLOAD_FIELDS[field]] = value
    elif where == "alert":
        body["alerts"][0][ALERT_FIELDS[field]] = value
    else:
        body["alerts"][0]["labels"][["deployment", "scale", "step", "target_dp_size"][field % 4]] = value
    response = post_alerts(anonymous, alertmanager_headers, body)
    assert response.status_code < 500, response.text


@pytest.mark.databases("sqlite", "postgres")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=JSON)
@example(body={"\x00": None})  # a NUL in a field name once made Postgres refuse the record: a 500
def test_signed_scale_answers_4xx_or_2xx_to_any_json(anonymous: TestClient, d1: str, body: Any) -> None:
    response = signed(anonymous, body)
    assert response.status_code < 500, response.text
