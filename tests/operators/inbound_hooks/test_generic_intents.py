"""Issue 26's four scenarios on the signed generic hook, each request signed by the Standard Webhooks
reference library (`standardwebhooks`, as a sender would): a sender's retries (the same webhook-id)
scale once; a request withdrawn (`status: resolved`) before its deferred intent runs leaves the
deployment where it is; two groups asking for opposite sizes move it once; an operator's scale is
never undone by a retry."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session
from standardwebhooks.webhooks import Webhook

from app.core.clock import utc_now
from app.scale import desired
from tests.operators.inbound_hooks.support import GLOBAL_SECRET, finish, jobs, make_deployment, succeed


def send(anonymous: TestClient, body: dict[str, Any], message_id: str) -> dict[str, Any]:
    """What a Standard Webhooks sender posts (and posts again, unchanged, when it retries)."""
    raw = json.dumps(body)
    now = datetime.now(UTC)
    headers = {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(GLOBAL_SECRET).sign(message_id, now, raw),
        "content-type": "application/json",
    }
    response = anonymous.post("/v1/hooks/scale", content=raw.encode(), headers=headers)
    assert response.status_code in (200, 202), response.text
    return dict(response.json())


def reconcile_later(db_engine: Engine, seconds: float) -> list[str]:
    with Session(db_engine) as session:
        return [job.id for job in desired.reconcile(session, now=utc_now() + timedelta(seconds=seconds))]


def test_a_senders_retries_of_one_request_scale_once(
    anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    body = {"deployment": "d1", "step": "+1", "group": "queue"}
    first = send(anonymous, body, "msg_steady")
    succeed(db_engine, first["job_id"])
    for _ in range(5):
        assert send(anonymous, body, "msg_steady")["duplicate_of"] == first["request_id"]
    assert reconcile_later(db_engine, 3600) == []
    assert [job.to_dp_size for job in jobs(db_engine)] == [3]


def test_a_request_withdrawn_before_its_deferred_intent_runs_leaves_the_deployment(
    anonymous: TestClient, client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=60)
    finish(
        db_engine,
        client.post("/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 3}).json()["id"],
    )
    asked = send(anonymous, {"deployment": "d1", "target_dp_size": 4, "group": "burst"}, "msg_burst")
    assert asked["code"] == "cooldown"
    withdrawn = send(anonymous, {"deployment": "d1", "status": "resolved", "group": "burst"}, "msg_burst_ok")
    assert (withdrawn["decision"], withdrawn["intent_id"]) == ("withdrawn", asked["intent_id"])
    assert reconcile_later(db_engine, 61) == []
    assert len(jobs(db_engine)) == 1


def test_two_groups_asking_for_opposite_sizes_move_the_deployment_once(
    anonymous: TestClient, client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", scale_down_window_s=60)
    busy = {"deployment": "d1", "target_dp_size": 4, "group": "busy"}
    idle = {"deployment": "d1", "target_dp_size": 1, "group": "idle"}
    succeed(db_engine, send(anonymous, busy, "msg_busy")["job_id"])
    assert send(anonymous, idle, "msg_idle")["decision"] == "held"
    for window in range(1, 6):  # five windows of retries and reconciler passes
        send(anonymous, busy, "msg_busy")
        send(anonymous, idle, "msg_idle")
        reconcile_later(db_engine, window * 61)
    assert [job.to_dp_size for job in jobs(db_engine)] == [4]


def test_an_operators_scale_is_never_undone_by_a_retry(
    anonymous: TestClient, client: TestClient, db_engine: Engine, d1: str
) -> None:
    body = {"deployment": "d1", "target_dp_size": 4, "group": "busy"}
    succeed(db_engine, send(anonymous, body, "msg_busy")["job_id"])
    operator = client.post("/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 2}).json()
    succeed(db_engine, operator["id"])
    for _ in range(3):
        assert send(anonymous, body, "msg_busy")["code"] == "duplicate"
    assert reconcile_later(db_engine, 3600) == []
    assert [job.to_dp_size for job in jobs(db_engine)] == [4, 2]
