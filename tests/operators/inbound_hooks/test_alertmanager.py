"""Alertmanager webhooks as scale requests: a firing alert scales the deployment it names, once per
firing episode; a resolved one is recorded and scales nothing; bad input is 4xx and creates nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from tests.operators.alertmanager_payloads import alert, firing_payload, payload, resolved_payload
from tests.operators.inbound_hooks.support import (
    assert_problem,
    finish,
    jobs,
    last_request,
    make_deployment,
    post_alerts,
)


def test_firing_alert_scales_the_deployment_it_names(
    anonymous: TestClient, alertmanager_headers: dict[str, str], db_engine: Engine, d1: str
) -> None:
    response = post_alerts(anonymous, alertmanager_headers, firing_payload("d1", target_dp_size=4))
    assert response.status_code == 200, response.text
    [result] = response.json()["results"]
    assert result["decision"] == "accepted" and "MoEQueueTooLong" in result["reason"]
    [job] = jobs(db_engine)
    assert (job.id, job.to_dp_size, job.requested_by, job.requester) == (
        result["job_id"],
        4,
        "autoscaler",
        "alertmanager",
    )


def test_scale_up_label_steps_by_one(
    anonymous: TestClient, alertmanager_headers: dict[str, str], db_engine: Engine, d1: str
) -> None:
    post_alerts(anonymous, alertmanager_headers, firing_payload("d1", scale="up"))
    assert jobs(db_engine)[0].to_dp_size == 3


def test_a_resolved_alert_with_nothing_standing_is_recorded_as_ignored_and_scales_nothing(
    anonymous: TestClient,
    client: TestClient,
    alertmanager_headers: dict[str, str],
    db_engine: Engine,
    d1: str,
) -> None:
    response = post_alerts(anonymous, alertmanager_headers, resolved_payload("d1"))
    assert response.status_code == 200
    [result] = response.json()["results"]
    assert (result["decision"], result["code"]) == ("ignored", "resolved")
    assert "nothing to withdraw" in result["reason"]
    assert jobs(db_engine) == []
    assert last_request(client)["source"] == "alertmanager"


@pytest.mark.databases("sqlite", "postgres")
def test_repeated_notification_of_one_firing_episode_scales_once(
    anonymous: TestClient, alertmanager_headers: dict[str, str], db_engine: Engine, d1: str
) -> None:
    body = firing_payload("d1", scale="up")
    assert post_alerts(anonymous, alertmanager_headers, body).json()["results"][0]["decision"] == "accepted"
    finish(db_engine, jobs(db_engine)[0].id)
    again = post_alerts(anonymous, alertmanager_headers, body).json()["results"][0]
    assert (again["decision"], again["code"]) == ("ignored", "duplicate")
    later = firing_payload("d1", scale="up", starts_at="2026-11-29T12:00:00.000Z")
    assert post_alerts(anonymous, alertmanager_headers, later).json()["results"][0]["decision"] == "accepted"
    assert len(jobs(db_engine)) == 2


def test_one_notification_for_two_deployments_scales_each(
    client: TestClient,
    anonymous: TestClient,
    alertmanager_headers: dict[str, str],
    db_engine: Engine,
    d1: str,
) -> None:
    make_deployment(client, db_engine, "d2")
    body = payload(
        [alert(deployment="d1", labels={"scale": "up"}), alert(deployment="d2", labels={"step": "-1"})]
    )
    results = post_alerts(anonymous, alertmanager_headers, body).json()["results"]
    assert sorted((r["deployment"], r["target_dp_size"]) for r in results) == [("d1", 3), ("d2", 1)]


def test_alert_for_an_unknown_deployment_is_recorded_and_answered_404(
    anonymous: TestClient, client: TestClient, alertmanager_headers: dict[str, str], d1: str
) -> None:
    response = post_alerts(anonymous, alertmanager_headers, firing_payload("ghost", scale="up"))
    assert_problem(response, 404, "unknown-deployment")
    assert response.json()["results"][0]["code"] == "unknown-deployment"
    assert last_request(client)["decision"] == "rejected"


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"[]",
        {"version": "3", "groupKey": "g", "status": "firing", "alerts": [alert(deployment="d1")]},
        {"version": "4", "status": "firing", "alerts": [alert(deployment="d1")]},
        {"version": "4", "groupKey": "g", "status": "firing", "alerts": []},
        {
            "version": "4",
            "groupKey": "g",
            "status": "firing",
            "alerts": [{"status": "firing", "labels": "x"}],
        },
        {
            "version": "4",
            "groupKey": "g",
            "status": "firing",
            "alerts": [{"status": "firing", "startsAt": "then"}],
        },
        {"version": "4", "groupKey": "g", "status": "boom", "alerts": [alert(deployment="d1")]},
    ],
)
def test_malformed_alertmanager_payload_is_422_never_5xx(
    anonymous: TestClient, alertmanager_headers: dict[str, str], db_engine: Engine, d1: str, body: Any
) -> None:
    response = post_alerts(anonymous, alertmanager_headers, body)
    assert_problem(response, 422, "malformed-hook-body")
    assert jobs(db_engine) == []


def test_alertmanager_without_token_is_401(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    response = anonymous.post("/v1/hooks/alertmanager", json=firing_payload("d1", scale="up"))
    assert_problem(response, 401, "missing-token")
    assert jobs(db_engine) == []
