"""A deployment's desired size: autoscaler requests (hooks, Alertmanager, the `/scale` PUT) record it,
and the runner's `desired-size` task acts on it once no job is active and the cooldown allows,
without a repeat from the autoscaler."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.backends.reference.record import JobRecord
from app.core.clock import utc_now
from app.core.runner_settings import RunnerSettings
from app.runner.scheduled import reconcile_desired_sizes, scheduled_tasks
from app.scale import desired
from app.scale.intents import ScaleIntentRow
from tests.operators.alertmanager_payloads import alert, payload
from tests.operators.inbound_hooks.support import (
    alertmanager_headers,  # noqa: F401  (a fixture)
    anonymous,  # noqa: F401  (a fixture)
    assert_problem,
    finish,
    jobs,
    make_deployment,
    post_alerts,
    settings_with_inbound_secrets,  # noqa: F401  (a fixture)
    signed,
    succeed,
)


def reconcile_later(db_engine: Engine, seconds: float) -> list[str]:
    """One pass of the reconciler as if `seconds` had passed."""
    with Session(db_engine) as session:
        return [job.id for job in desired.reconcile(session, now=utc_now() + timedelta(seconds=seconds))]


def shown(client: TestClient, name: str = "d1") -> dict[str, Any]:
    return dict(client.get(f"/v1/deployments/{name}").json()["desired"])


def test_a_request_refused_for_the_cooldown_is_acted_on_after_it_without_a_repeat(
    anonymous: TestClient,  # noqa: F811
    client: TestClient,
    db_engine: Engine,
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    first = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()
    finish(db_engine, first["job_id"])
    assert signed(anonymous, {"deployment": "d1", "target_dp_size": 4}).json()["decision"] == "deferred"
    view = shown(client)
    assert (view["dp_size"], view["source"], view["pending"], view["blocked_by"]) == (
        4,
        "generic",
        True,
        "cooldown",
    )
    assert view["next_scale_at"] is not None
    assert reconcile_later(db_engine, 10) == []  # still inside the cooldown
    [started] = reconcile_later(db_engine, 601)
    job = jobs(db_engine)[-1]
    assert (job.id, job.to_dp_size, job.requested_by) == (started, 4, "autoscaler")
    assert shown(client)["pending"] is False
    assert reconcile_later(db_engine, 1200) == []  # acted on once


def test_a_request_deferred_for_an_active_job_starts_when_the_job_ends(
    anonymous: TestClient,  # noqa: F811
    client: TestClient,
    db_engine: Engine,
) -> None:
    make_deployment(client, db_engine, "d1")
    first = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()
    assert signed(anonymous, {"deployment": "d1", "target_dp_size": 1}).json()["code"] == "active-job"
    assert reconcile_later(db_engine, 0) == []
    finish(db_engine, first["job_id"])
    [started] = reconcile_later(db_engine, 0)
    assert jobs(db_engine)[-1].to_dp_size == 1 and started == jobs(db_engine)[-1].id


def test_two_opposite_alerts_move_the_size_once_per_cooldown(
    anonymous: TestClient,  # noqa: F811
    client: TestClient,
    alertmanager_headers: dict[str, str],  # noqa: F811
    db_engine: Engine,
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    down = payload([alert(deployment="d1", alertname="Idle", labels={"step": "-1"})], group_key="{}:idle")
    up = payload(
        [alert(deployment="d1", alertname="Busy", labels={"target_dp_size": "4"})], group_key="{}:busy"
    )
    assert post_alerts(anonymous, alertmanager_headers, down).json()["results"][0]["decision"] == "accepted"
    finish(db_engine, jobs(db_engine)[0].id)
    assert post_alerts(anonymous, alertmanager_headers, up).json()["results"][0]["decision"] == "deferred"
    assert post_alerts(anonymous, alertmanager_headers, down).json()["results"][0]["code"] == "duplicate"
    assert len(jobs(db_engine)) == 1
    assert reconcile_later(db_engine, 300) == []
    assert len(reconcile_later(db_engine, 601)) == 1
    assert [job.to_dp_size for job in jobs(db_engine)] == [1, 4]


def test_a_second_alert_joining_a_firing_group_is_a_new_intent_asking_the_same_size(
    anonymous: TestClient,  # noqa: F811
    alertmanager_headers: dict[str, str],  # noqa: F811
    client: TestClient,
    db_engine: Engine,
) -> None:
    make_deployment(client, db_engine, "d1")
    one = alert(deployment="d1", labels={"step": "-1", "instance": "a"})
    two = alert(deployment="d1", labels={"step": "-1", "instance": "b"}, starts_at="2026-11-29T10:01:00.000Z")
    post_alerts(anonymous, alertmanager_headers, payload([one]))
    succeed(db_engine, jobs(db_engine)[0].id)
    again = post_alerts(anonymous, alertmanager_headers, payload([one, two])).json()["results"][0]
    # The step counts from where the group's firing episode began (2), not from the size it reached.
    assert (again["decision"], again["code"], again["target_dp_size"]) == ("ignored", "already-at-size", 1)
    assert len(jobs(db_engine)) == 1


def test_unusable_labels_are_a_422_naming_them_and_usable_alerts_still_act(
    anonymous: TestClient,  # noqa: F811
    alertmanager_headers: dict[str, str],  # noqa: F811
    client: TestClient,
    db_engine: Engine,
) -> None:
    make_deployment(client, db_engine, "d1")
    make_deployment(client, db_engine, "d2")
    body = payload(
        [alert(deployment="d1", labels={"scale": "up"}), alert(deployment="d2", labels={"scale": "sideways"})]
    )
    response = post_alerts(anonymous, alertmanager_headers, body)
    assert_problem(response, 422, "unusable-labels")
    assert "sideways" in response.json()["detail"]
    codes = sorted(r["code"] for r in response.json()["results"])
    assert codes == ["scaling", "unusable-labels"]
    assert [job.to_dp_size for job in jobs(db_engine)] == [3]


@pytest.mark.parametrize("labels", [{}, {"target_dp_size": "many"}])
def test_an_alert_without_a_usable_size_is_422(
    anonymous: TestClient,  # noqa: F811
    alertmanager_headers: dict[str, str],  # noqa: F811
    client: TestClient,
    db_engine: Engine,
    labels: dict[str, str],
) -> None:
    make_deployment(client, db_engine, "d1")
    response = post_alerts(anonymous, alertmanager_headers, payload([alert(deployment="d1", labels=labels)]))
    assert_problem(response, 422, "unusable-labels")
    assert jobs(db_engine) == []


def test_an_operator_job_supersedes_a_pending_desire(
    anonymous: TestClient,  # noqa: F811
    client: TestClient,
    db_engine: Engine,
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    first = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()
    finish(db_engine, first["job_id"])
    signed(anonymous, {"deployment": "d1", "target_dp_size": 4})
    operator = client.post("/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 1})
    assert operator.status_code == 202
    assert shown(client)["pending"] is False
    finish(db_engine, operator.json()["id"])
    assert reconcile_later(db_engine, 601) == []


def test_a_scale_put_during_a_job_is_recorded_and_reconciled_later(
    client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1")
    body = {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": "d1"},
        "spec": {"replicas": 3},
    }
    first = client.put("/v1/deployments/d1/scale", json=body)
    body["spec"] = {"replicas": 4}
    second = client.put("/v1/deployments/d1/scale", json=body)
    assert second.status_code == 200 and "location" not in second.headers
    assert "is still pending" in second.json()["metadata"]["annotations"]["epctl.io/deferred"]
    finish(db_engine, first.headers["location"].rsplit("/", 1)[-1])
    assert client.get("/v1/deployments/d1/scale").json()["spec"]["replicas"] == 4
    assert shown(client)["source"] == "scale-subresource"
    reconcile_later(db_engine, 0)
    job = jobs(db_engine)[-1]
    assert (job.to_dp_size, job.requested_by) == (4, "scale-subresource")


def test_the_runner_reconciles_desired_sizes_as_a_scheduled_task(
    anonymous: TestClient,  # noqa: F811
    client: TestClient,
    db_engine: Engine,
) -> None:
    make_deployment(client, db_engine, "d1")
    first = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()
    signed(anonymous, {"deployment": "d1", "target_dp_size": 4})
    finish(db_engine, first["job_id"])
    tasks = scheduled_tasks(JobRecord(db_engine), RunnerSettings())
    assert "desired-size" in [task.name for task in tasks]
    started = asyncio.run(reconcile_desired_sizes(JobRecord(db_engine)))
    assert len(started) == 1 and jobs(db_engine)[-1].to_dp_size == 4
    with Session(db_engine) as session:
        intent = session.exec(select(ScaleIntentRow).where(ScaleIntentRow.job_id == started[0])).one()
        assert intent.requester == "signature:global"
