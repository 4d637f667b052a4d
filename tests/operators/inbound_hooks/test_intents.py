"""Issue 26, items 1-3 through the API: a notification is decided once by what it asks (repeats are
duplicates linked to that decision), withdrawn when it resolves or leaves its group, superseded by an
operator; competing intents follow one rule (the highest standing ask, HPA's windows) and the
deployment's `autoscale_paused` switch; every decision is a record, an event and a metric."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.scale import desired
from app.webhooks.models import EventType, OutboxEvent
from tests.operators.alertmanager_payloads import alert, firing_payload, payload, resolved_payload
from tests.operators.inbound_hooks.support import (
    assert_problem,
    finish,
    jobs,
    make_deployment,
    post_alerts,
    signed,
    succeed,
)
from tests.support.fixtures import token_headers


def reconcile_later(db_engine: Engine, seconds: float) -> list[str]:
    with Session(db_engine) as session:
        return [job.id for job in desired.reconcile(session, now=utc_now() + timedelta(seconds=seconds))]


def result_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    [result] = response.json()["results"]
    return dict(result)


def records(client: TestClient) -> list[dict[str, Any]]:
    return list(reversed(client.get("/v1/hooks/requests", params={"limit": 500}).json()["data"]))


# --- 1. decided exactly once -------------------------------------------------------------------------


def test_four_copies_of_one_notification_are_one_decision_and_three_duplicates_linked_to_it(
    anonymous: TestClient,
    alertmanager_headers: dict[str, str],
    client: TestClient,
    db_engine: Engine,
    d1: str,
) -> None:
    body = firing_payload("d1", step="+1")
    first = result_of(post_alerts(anonymous, alertmanager_headers, body))
    succeed(db_engine, first["job_id"])
    for _ in range(3):
        again = result_of(post_alerts(anonymous, alertmanager_headers, body))
        assert (again["decision"], again["code"], again["duplicate_of"]) == (
            "ignored",
            "duplicate",
            first["request_id"],
        )
    assert reconcile_later(db_engine, 3600) == []
    assert [job.to_dp_size for job in jobs(db_engine)] == [3]


def test_a_repeat_after_an_operator_scaled_never_undoes_the_operator(
    anonymous: TestClient,
    alertmanager_headers: dict[str, str],
    client: TestClient,
    db_engine: Engine,
    d1: str,
) -> None:
    body = firing_payload("d1", target_dp_size=4)
    succeed(db_engine, result_of(post_alerts(anonymous, alertmanager_headers, body))["job_id"])
    operator = client.post("/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 2})
    assert operator.status_code == 202
    succeed(db_engine, operator.json()["id"])
    assert result_of(post_alerts(anonymous, alertmanager_headers, body))["code"] == "duplicate"
    assert reconcile_later(db_engine, 3600) == []
    assert [job.to_dp_size for job in jobs(db_engine)] == [4, 2]


def test_an_operator_job_supersedes_a_pending_intent_and_says_so(
    anonymous: TestClient, alertmanager_headers: dict[str, str], client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    succeed(db_engine, signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()["job_id"])
    deferred = result_of(post_alerts(anonymous, alertmanager_headers, firing_payload("d1", target_dp_size=4)))
    assert (deferred["decision"], deferred["code"]) == ("deferred", "cooldown")
    operator = client.post("/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 1}).json()
    superseded = [r for r in records(client) if r["decision"] == "superseded"]
    assert [(r["intent_id"], r["code"]) for r in superseded] == [(deferred["intent_id"], "operator-job")]
    assert operator["id"] in superseded[0]["reason"]
    finish(db_engine, operator["id"])
    assert reconcile_later(db_engine, 601) == []


# --- 2. withdrawn ------------------------------------------------------------------------------------


def test_a_resolved_notification_withdraws_an_intent_not_yet_acted_on(
    anonymous: TestClient, alertmanager_headers: dict[str, str], client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    succeed(db_engine, signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()["job_id"])
    asked = result_of(post_alerts(anonymous, alertmanager_headers, firing_payload("d1", target_dp_size=4)))
    assert asked["decision"] == "deferred"
    withdrawn = result_of(post_alerts(anonymous, alertmanager_headers, resolved_payload("d1")))
    assert (withdrawn["decision"], withdrawn["code"], withdrawn["intent_id"]) == (
        "withdrawn",
        "resolved",
        asked["intent_id"],
    )
    assert "withdrawn before it was acted on" in withdrawn["reason"]
    assert reconcile_later(db_engine, 601) == []
    assert client.get("/v1/deployments/d1").json()["desired"]["pending"] is False
    again = result_of(post_alerts(anonymous, alertmanager_headers, resolved_payload("d1")))
    assert (again["code"], again["duplicate_of"]) == ("duplicate", withdrawn["request_id"])


def test_a_resolved_notification_after_acting_undoes_nothing(
    anonymous: TestClient, alertmanager_headers: dict[str, str], db_engine: Engine, d1: str
) -> None:
    succeed(
        db_engine,
        result_of(post_alerts(anonymous, alertmanager_headers, firing_payload("d1", scale="up")))["job_id"],
    )
    ended = result_of(post_alerts(anonymous, alertmanager_headers, resolved_payload("d1")))
    assert (ended["decision"], ended["code"]) == ("ignored", "resolved")
    assert "nothing is undone" in ended["reason"]
    assert reconcile_later(db_engine, 3600) == [] and len(jobs(db_engine)) == 1


def test_a_group_that_no_longer_names_a_deployment_withdraws_its_intent(
    anonymous: TestClient, alertmanager_headers: dict[str, str], client: TestClient, db_engine: Engine
) -> None:
    d1_id = make_deployment(client, db_engine, "d1", cooldown_s=600)
    make_deployment(client, db_engine, "d2", cooldown_s=600)
    for name in ("d1", "d2"):
        succeed(db_engine, signed(anonymous, {"deployment": name, "target_dp_size": 3}).json()["job_id"])
    both = [alert(deployment=name, labels={"target_dp_size": "4"}) for name in ("d1", "d2")]
    results = post_alerts(anonymous, alertmanager_headers, payload(both)).json()["results"]
    assert {r["decision"] for r in results} == {"deferred"}
    later = post_alerts(anonymous, alertmanager_headers, payload(both[:1])).json()["results"]
    left = [r for r in later if r["deployment"] == "d2"]
    assert [(r["decision"], r["code"]) for r in left] == [("withdrawn", "left-group")]
    assert [r["code"] for r in later if r["deployment"] == "d1"] == ["duplicate"]
    reconcile_later(db_engine, 601)
    assert [(job.deployment_id, job.to_dp_size) for job in jobs(db_engine) if job.to_dp_size == 4] == [
        (d1_id, 4)
    ]


def test_a_generic_request_with_status_resolved_withdraws_its_groups_intent(
    anonymous: TestClient, client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    succeed(db_engine, signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()["job_id"])
    asked = signed(anonymous, {"deployment": "d1", "target_dp_size": 4, "group": "queue"}).json()
    assert asked["decision"] == "deferred"
    other = signed(anonymous, {"deployment": "d1", "status": "resolved", "group": "other"}).json()
    assert (other["decision"], other["code"]) == ("ignored", "resolved")
    withdrawn = signed(anonymous, {"deployment": "d1", "status": "resolved", "group": "queue"}).json()
    assert (withdrawn["decision"], withdrawn["intent_id"]) == ("withdrawn", asked["intent_id"])
    assert reconcile_later(db_engine, 601) == []


def test_a_groups_newer_request_replaces_its_pending_intent(
    anonymous: TestClient, client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    operator = client.post("/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 3}).json()
    succeed(db_engine, operator["id"])
    first = signed(anonymous, {"deployment": "d1", "target_dp_size": 4, "group": "q"}).json()
    second = signed(anonymous, {"deployment": "d1", "target_dp_size": 2, "group": "q"}).json()
    replaced = [r for r in records(client) if r["decision"] == "superseded"]
    assert [(r["intent_id"], r["code"]) for r in replaced] == [(first["intent_id"], "replaced")]
    [started] = reconcile_later(db_engine, 601)
    assert jobs(db_engine)[-1].to_dp_size == 2
    assert client.get("/v1/hooks/requests").json()["data"][0]["job_id"] == started
    assert next(r for r in records(client) if r["id"] == second["request_id"])["job_id"] == started


# --- 3. one rule, no flapping, paused -----------------------------------------------------------------


def test_the_default_scale_down_window_holds_a_scale_down_and_the_coordinator_acts_after_it(
    anonymous: TestClient, client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", behavior={})  # HPA's defaults: scale_down 300 s, scale_up 0 s
    held = signed(anonymous, {"deployment": "d1", "step": -1}).json()
    assert (held["decision"], held["code"]) == ("held", "stabilization-window") and held["next_scale_at"]
    view = client.get("/v1/deployments/d1").json()
    assert view["autoscale_behavior"]["scale_down"]["stabilization_window_s"] == 300
    assert (view["desired"]["dp_size"], view["desired"]["blocked_by"]) == (1, "stabilization-window")
    assert reconcile_later(db_engine, 200) == []
    [started] = reconcile_later(db_engine, 301)
    assert jobs(db_engine)[-1].to_dp_size == 1
    linked = next(r for r in records(client) if r["id"] == held["request_id"])
    assert (linked["job_id"], linked["intent_state"]) == (started, "acted")


def test_two_groups_asking_opposite_sizes_move_the_deployment_once(
    anonymous: TestClient, alertmanager_headers: dict[str, str], client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", behavior={})
    busy = payload(
        [alert(deployment="d1", alertname="Busy", labels={"target_dp_size": "4"})], group_key="{}:busy"
    )
    idle = payload([alert(deployment="d1", alertname="Idle", labels={"step": "-1"})], group_key="{}:idle")
    succeed(db_engine, result_of(post_alerts(anonymous, alertmanager_headers, busy))["job_id"])
    held = result_of(post_alerts(anonymous, alertmanager_headers, idle))
    assert (held["decision"], held["code"]) == ("held", "higher-intent")
    for minutes in range(0, 60, 5):  # an hour of repeats and reconciler passes
        post_alerts(anonymous, alertmanager_headers, busy)
        post_alerts(anonymous, alertmanager_headers, idle)
        reconcile_later(db_engine, minutes * 60)
    assert [job.to_dp_size for job in jobs(db_engine)] == [4]


def test_paused_autoscaling_records_intents_lets_operators_scale_and_acts_once_resumed(
    anonymous: TestClient, client: TestClient, db_engine: Engine, d1: str
) -> None:
    assert client.patch("/v1/deployments/d1", json={"autoscale_paused": True}).json()["autoscale_paused"]
    paused = signed(anonymous, {"deployment": "d1", "target_dp_size": 4}).json()
    assert (paused["decision"], paused["code"]) == ("paused", "paused")
    assert reconcile_later(db_engine, 3600) == [] and jobs(db_engine) == []
    autoscaler = token_headers(client, "autoscaler", "keda")
    direct = anonymous.post(
        "/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 3}, headers=autoscaler
    )
    assert_problem(direct, 409, "autoscaling-paused")
    client.patch("/v1/deployments/d1", json={"autoscale_paused": False})
    [started] = reconcile_later(db_engine, 0)
    assert jobs(db_engine)[-1].to_dp_size == 4 and jobs(db_engine)[-1].id == started


def test_an_operator_job_runs_while_paused(client: TestClient, db_engine: Engine, d1: str) -> None:
    client.patch("/v1/deployments/d1", json={"autoscale_paused": True})
    response = client.post("/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 3})
    assert response.status_code == 202, response.text


def test_every_decision_is_announced_and_counted(
    anonymous: TestClient, client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    succeed(db_engine, signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()["job_id"])
    deferred = signed(anonymous, {"deployment": "d1", "target_dp_size": 4, "group": "g"}).json()
    signed(anonymous, {"deployment": "d1", "status": "resolved", "group": "g"})
    with Session(db_engine) as session:
        events = session.exec(
            select(OutboxEvent)
            .where(col(OutboxEvent.type) == EventType.autoscaler_decision.value)
            .order_by(col(OutboxEvent.created_at))
        ).all()
    decisions = [(e.payload["data"]["decision"], e.payload["data"]["code"]) for e in events]
    assert decisions == [("accepted", "scaling"), ("deferred", "cooldown"), ("withdrawn", "resolved")]
    assert events[1].payload["data"]["intent_id"] == deferred["intent_id"]
    scrape = client.get("/metrics").text
    for decision, code in decisions:
        line = f'epctl_autoscaler_decisions_total{{code="{code}",decision="{decision}",source="generic"}}'
        assert line in scrape, line


# --- Alertmanager's own fields and bounds ---------------------------------------------------------------


def test_truncated_alerts_are_recorded(
    anonymous: TestClient, alertmanager_headers: dict[str, str], client: TestClient, d1: str
) -> None:
    body = {**firing_payload("d1", scale="up"), "truncatedAlerts": 7}
    result = result_of(post_alerts(anonymous, alertmanager_headers, body))
    recorded = next(r for r in records(client) if r["id"] == result["request_id"])
    assert recorded["details"]["truncated_alerts"] == 7


def test_a_2000_alert_notification_writes_a_bounded_number_of_records(
    anonymous: TestClient,
    alertmanager_headers: dict[str, str],
    client: TestClient,
    db_engine: Engine,
    d1: str,
) -> None:
    alerts = [alert(deployment="d1", labels={"scale": "up", "instance": f"i{i}"}) for i in range(1000)]
    alerts += [alert(deployment=f"ghost-{i}", labels={"scale": "up"}) for i in range(1000)]
    response = post_alerts(anonymous, alertmanager_headers, payload(alerts))
    assert_problem(response, 422, "too-many-deployments")
    codes = [r["code"] for r in response.json()["results"]]
    assert codes.count("scaling") == 1 and "too-many-deployments" in codes
    beyond = next(r for r in records(client) if r["code"] == "too-many-deployments")
    assert beyond["details"]["alerts_beyond_cap"] == 1000 - 31
    assert client.get("/v1/hooks/requests").json()["count"] == len(codes) <= 40
    assert len(jobs(db_engine)) == 1
