"""`/v1/engines`: agents register (idempotently), heartbeat, and deregister."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.core.clock import utc_now
from app.deployments.engines.models import Engine
from app.deployments.models import Deployment
from app.webhooks.models import OutboxEvent
from tests.support.fixtures import token_headers


def _registration(engine_id: str = "e0", **overrides: Any) -> dict[str, Any]:
    body = {
        "engine_id": engine_id,
        "deployment": "demo",
        "url": "http://127.0.0.1:9000",
        "platform": "cpu",
        "device": "cpu",
        "engine": {},
    }
    return {**body, **overrides}


def _deployment(client: TestClient) -> None:
    assert client.post("/v1/deployments", json={"name": "demo", "launcher": "static"}).status_code == 201


def test_register_creates_the_engine(client: TestClient) -> None:
    _deployment(client)
    response = client.post("/v1/engines", json=_registration())
    assert response.status_code == 201
    body = response.json()
    assert (body["id"], body["deployment"], body["state"], body["launched_by"]) == (
        "e0",
        "demo",
        "registered",
        "static",
    )


def test_registering_again_updates_the_same_engine(client: TestClient) -> None:
    _deployment(client)
    client.post("/v1/engines", json=_registration())
    response = client.post("/v1/engines", json=_registration(url="http://127.0.0.1:9999"))
    assert response.status_code == 200 and response.json()["url"] == "http://127.0.0.1:9999"
    assert client.get("/v1/engines").json()["count"] == 1


def test_registration_with_another_engine_config_is_409(client: TestClient) -> None:
    _deployment(client)
    response = client.post("/v1/engines", json=_registration(engine={"hidden_size": 8}))
    assert response.status_code == 409 and response.json()["code"] == "engine-config-mismatch"


def test_registration_for_an_unknown_deployment_is_404(client: TestClient) -> None:
    response = client.post("/v1/engines", json=_registration(deployment="nope"))
    assert response.status_code == 404 and response.json()["code"] == "deployment-not-found"


def test_heartbeat_records_state_generation_and_rank(client: TestClient) -> None:
    _deployment(client)
    client.post("/v1/engines", json=_registration())
    response = client.post(
        "/v1/engines/e0/heartbeat", json={"state": "serving", "generation": 3, "rank": 1, "world_size": 2}
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["state"], body["generation"], body["dp_rank"], body["world_size"]) == ("serving", 3, 1, 2)


def test_heartbeat_of_an_unknown_engine_is_404(client: TestClient) -> None:
    response = client.post("/v1/engines/ghost/heartbeat", json={"state": "serving", "generation": 0})
    assert response.status_code == 404 and response.json()["code"] == "engine-not-found"


def test_deregister_marks_the_engine_left(client: TestClient) -> None:
    _deployment(client)
    client.post("/v1/engines", json=_registration())
    assert client.delete("/v1/engines/e0").status_code == 204
    assert client.get("/v1/engines/e0").json()["state"] == "left"
    assert client.get("/v1/engines", params={"state": "left"}).json()["count"] == 1


def test_agents_with_an_operator_token_may_register_but_viewers_not(client: TestClient) -> None:
    _deployment(client)
    assert (
        client.post("/v1/engines", json=_registration(), headers=token_headers(client, "viewer")).status_code
        == 403
    )
    assert (
        client.post(
            "/v1/engines", json=_registration(), headers=token_headers(client, "operator")
        ).status_code
        == 201
    )


@pytest.mark.databases("sqlite", "postgres")
def test_a_heartbeat_answers_the_record_and_renews_it_in_full(client: TestClient, session: Session) -> None:
    """The steady path (one statement) writes what the whole one would: the broken group and the data
    link it no longer reports are cleared, a lost control link is heard again, a left engine is 409."""
    _deployment(client)
    client.post("/v1/engines", json=_registration())
    broken = {"state": "serving", "generation": 3, "rank": 1, "world_size": 2, "broken_generation": 2}
    first = client.post("/v1/engines/e0/heartbeat", json={**broken, "data_unreachable": ["e1"]}).json()
    assert (first["broken_generation"], first["data_unreachable"]) == (2, ["e1"])
    row = session.get(Engine, "e0")
    assert row is not None
    row.link_lost_at = utc_now()
    session.add(row)
    session.commit()
    beat = {"state": "serving", "generation": 3, "rank": 1, "world_size": 2, "group_steps": 7}
    answer = client.post("/v1/engines/e0/heartbeat", json=beat)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (
        body["deployment"],
        body["broken_generation"],
        body["data_unreachable"],
        body["link_lost_at"],
    ) == (
        "demo",
        None,
        None,
        None,
    )
    assert body["coordinators"] == [] and body["last_heartbeat_at"] > first["last_heartbeat_at"]
    again = client.post("/v1/engines/e0/heartbeat", json=beat).json()
    recorded = client.get("/v1/engines/e0").json()
    assert {k: v for k, v in again.items() if k != "coordinators"} == recorded
    assert client.delete("/v1/engines/e0").status_code == 204
    left = client.post("/v1/engines/e0/heartbeat", json=beat)
    assert left.status_code == 409 and left.json()["code"] == "engine-left"


def test_the_first_heartbeat_reporting_a_broken_group_wakes_the_liveness_pass(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: the deployment must not read `ready` until the pass comes round; a repeat of the same
    break, or a steady heartbeat, wakes nothing (every heartbeat of a broken member repeats it)."""
    rung: list[str] = []
    monkeypatch.setattr("app.core.wake.ring", rung.append)
    _deployment(client)
    client.post("/v1/engines", json=_registration())
    steady = {"state": "serving", "generation": 2, "rank": 0, "world_size": 2}
    broken = {"state": "idle", "generation": 0, "rank": None, "world_size": 0, "broken_generation": 2}
    for beat, expected in [(steady, []), (broken, ["liveness"]), (broken, ["liveness"])]:
        assert client.post("/v1/engines/e0/heartbeat", json=beat).status_code == 200
        assert rung == expected
    assert client.post("/v1/engines/e0/heartbeat", json={**broken, "broken_generation": 3}).status_code == 200
    assert rung == ["liveness", "liveness"]


@pytest.mark.databases("sqlite", "postgres")  # the deployment's row locked in the heartbeat's transaction
def test_the_first_heartbeat_reporting_a_broken_group_leaves_the_deployment_degraded_as_it_commits(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: the deployment never reads `ready` with a member out of its group. No liveness pass runs
    here (the runner is off, the wake is caught): the heartbeat's own transaction writes the status
    through the one writer, with its event and its incident (the loss on the survivor's own record).
    Before, the answer left it `ready`, 1 of 2 serving, until the pass it woke came round."""
    monkeypatch.setattr("app.core.wake.ring", lambda task: None)
    _deployment(client)
    for engine_id in ("e0", "e1"):
        assert client.post("/v1/engines", json=_registration(engine_id)).status_code == 201
    deployment = session.exec(select(Deployment).where(Deployment.name == "demo")).one()
    deployment.current_dp_size, deployment.generation = 2, 2
    session.add(deployment)
    session.commit()
    for rank, engine_id in enumerate(("e0", "e1")):
        beat = {"state": "serving", "generation": 2, "rank": rank, "world_size": 2}
        assert client.post(f"/v1/engines/{engine_id}/heartbeat", json=beat).status_code == 200
    assert client.get("/v1/deployments/demo").json()["status"] == "ready"
    last_step = time.time() - 1.0
    broken = {"state": "idle", "generation": 0, "rank": None, "world_size": 0, "broken_generation": 2}
    for _ in range(2):  # a repeat of the same break changes nothing
        beat = {**broken, "broken_last_step_at": last_step}
        assert client.post("/v1/engines/e0/heartbeat", json=beat).status_code == 200
        body = client.get("/v1/deployments/demo").json()
        assert (body["status"], body["status_detail"]["reason"]) == ("degraded", "members-missing"), body
        assert body["status_detail"]["message"].startswith("1 of 2 engines serve generation 2"), body
        incidents = client.get("/v1/incidents", params={"deployment": "demo"}).json()["data"]
        assert [(i["state"], i["reason"], i["loss_evidence"]) for i in incidents] == [
            ("open", "members-missing", "agents")
        ], incidents
        session.expire_all()
        events = session.exec(select(OutboxEvent).where(OutboxEvent.type == "deployment.degraded")).all()
        assert [e.payload["data"]["serving"] for e in events] == [1], [e.payload for e in events]
