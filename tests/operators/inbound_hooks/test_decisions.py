"""What an accepted inbound hook request decides: the target clamped to the deployment's limits,
ignored when that changes nothing, deferred while a job runs or the cooldown lasts; and the record of
every authenticated request with its decision."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.deployments.models import Deployment
from app.webhooks import signing
from tests.operators.alertmanager_payloads import resolved_payload
from tests.operators.inbound_hooks.support import finish, jobs, make_deployment, post_alerts, signed

# --- decisions --------------------------------------------------------------------------------------


def test_target_above_max_is_clamped_to_max(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    outcome = signed(anonymous, {"deployment": "d1", "target_dp_size": 9}).json()
    assert (outcome["requested_dp_size"], outcome["target_dp_size"]) == (9, 4)
    assert "clamped to max 4" in outcome["reason"]
    assert jobs(db_engine)[0].to_dp_size == 4


def test_step_below_min_is_clamped_to_min(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    outcome = signed(anonymous, {"deployment": "d1", "step": -5}).json()
    assert (outcome["requested_dp_size"], outcome["target_dp_size"]) == (-3, 1)
    assert jobs(db_engine)[0].to_dp_size == 1


def test_clamped_to_the_current_size_is_ignored(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    with Session(db_engine) as session:
        deployment = session.get(Deployment, d1)
        assert deployment is not None
        deployment.current_dp_size = 4
        session.commit()
    response = signed(anonymous, {"deployment": "d1", "step": "+2"})
    assert response.status_code == 200
    assert (response.json()["decision"], response.json()["code"]) == ("ignored", "already-at-size")
    assert jobs(db_engine) == []


def test_request_while_a_job_is_active_is_deferred(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    first = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()
    response = signed(anonymous, {"deployment": "d1", "target_dp_size": 4})
    assert response.status_code == 200 and response.json()["code"] == "active-job"
    assert response.json()["decision"] == "deferred"
    assert first["job_id"] in response.json()["reason"]
    assert len(jobs(db_engine)) == 1


def test_request_inside_the_cooldown_is_deferred_with_the_time_left(
    anonymous: TestClient, client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    first = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()
    finish(db_engine, first["job_id"])
    response = signed(anonymous, {"deployment": "d1", "target_dp_size": 4})
    assert response.status_code == 200 and response.json()["code"] == "cooldown"
    assert response.json()["decision"] == "deferred" and response.json()["next_scale_at"]
    assert "of 600 s left" in response.json()["reason"]
    assert len(jobs(db_engine)) == 1


def test_operator_scaling_starts_the_cooldown_too(
    client: TestClient, anonymous: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    operator_job = client.post("/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 3}).json()
    finish(db_engine, operator_job["id"])
    response = signed(anonymous, {"deployment": "d1", "target_dp_size": 4})
    assert response.status_code == 200 and response.json()["code"] == "cooldown"
    assert operator_job["id"] in response.json()["reason"]


# --- the record -------------------------------------------------------------------------------------


def test_every_request_is_listed_with_its_decision_and_filterable(
    anonymous: TestClient, client: TestClient, alertmanager_headers: dict[str, str], d1: str
) -> None:
    signed(anonymous, {"deployment": "d1", "target_dp_size": 3})
    signed(anonymous, {"deployment": "d1", "target_dp_size": 4})
    signed(anonymous, {"deployment": "d1", "target_dp_size": 4}, secret=signing.generate_secret())
    post_alerts(anonymous, alertmanager_headers, resolved_payload("d1"))
    signed(anonymous, {"deployment": "d1", "step": "sideways"})  # authenticated, then refused
    listed = client.get("/v1/hooks/requests").json()
    # The bad signature is not among them: only authenticated requests are recorded.
    assert listed["count"] == 4
    assert [r["decision"] for r in listed["data"]] == ["rejected", "ignored", "deferred", "accepted"]
    rejected = client.get("/v1/hooks/requests", params={"decision": "rejected"}).json()
    assert rejected["count"] == 1 and rejected["data"][0]["details"]["code"] == "malformed-hook-body"
    assert client.get("/v1/hooks/requests", params={"source": "alertmanager"}).json()["count"] == 1
