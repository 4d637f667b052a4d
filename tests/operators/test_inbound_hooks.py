"""Inbound autoscaler hooks: signed generic requests and Alertmanager webhooks -> jobs, or a recorded
reason why not. Bad input is 4xx problem+json and creates nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.core.config import Settings
from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationJob
from app.jobs.states import JobState, transition
from app.webhooks import signing
from tests.operators.alertmanager_payloads import alert, firing_payload, payload, resolved_payload
from tests.support.factories import register_engines
from tests.support.fixtures import ADMIN_TOKEN, token_headers

GLOBAL_SECRET = signing.generate_secret()
D1_SECRET = signing.generate_secret()
PROBLEM = "application/problem+json"


@pytest.fixture(name="settings")
def settings_with_inbound_secrets(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    monkeypatch.setenv("EPCTL_WEBHOOK_WORKER_ENABLED", "false")
    return Settings(
        database_url=database_url,
        data_dir=tmp_path / "data",
        admin_token=ADMIN_TOKEN,
        hooks_inbound_secret=GLOBAL_SECRET,
        hooks_inbound_secrets={"d1": D1_SECRET},
    )


@pytest.fixture
def anonymous(app: FastAPI, client: TestClient) -> Iterator[TestClient]:
    """A client without the admin token (the `client` fixture has started the app)."""
    yield TestClient(app)


@pytest.fixture
def d1(client: TestClient, db_engine: Engine) -> str:
    """Deployment d1: limits [1, 4], serving at DP size 2, four engines known, no cooldown."""
    return make_deployment(client, db_engine, "d1")


def make_deployment(client: TestClient, db_engine: Engine, name: str, *, cooldown_s: float = 0.0) -> str:
    body = {
        "name": name,
        "launcher": "static",
        "min_dp_size": 1,
        "max_dp_size": 4,
        "autoscale_cooldown_s": cooldown_s,
    }
    assert client.post("/v1/deployments", json=body).status_code == 201
    with Session(db_engine) as session:
        deployment = session.exec(select(Deployment).where(Deployment.name == name)).one()
        register_engines(session, deployment, 4)
        deployment.current_dp_size = 2
        session.add(deployment)
        session.commit()
        return deployment.id


def signed(
    anonymous: TestClient,
    body: Any,
    *,
    secret: str = GLOBAL_SECRET,
    message_id: str | None = None,
    timestamp: int | None = None,
) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = signing.signature_headers(
        secret, message_id or signing.new_message_id(), timestamp or int(time.time()), raw
    )
    headers["content-type"] = "application/json"
    return anonymous.post("/v1/hooks/scale", content=raw, headers=headers)


def jobs(db_engine: Engine) -> list[ReconfigurationJob]:
    with Session(db_engine) as session:
        return list(session.exec(select(ReconfigurationJob).order_by(ReconfigurationJob.created_at)).all())


def finish(db_engine: Engine, job_id: str) -> None:
    with Session(db_engine) as session:
        transition(session, job_id=job_id, from_state=JobState.pending, to_state=JobState.cancelled)


def last_request(client: TestClient) -> dict[str, Any]:
    data = client.get("/v1/hooks/requests").json()["data"]
    assert data, "every inbound request is recorded"
    return dict(data[0])


def assert_problem(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    problem = response.json()
    assert problem["status"] == status and problem["code"] == code
    assert {"type", "title", "detail", "instance"} <= set(problem)


# --- generic, signed --------------------------------------------------------------------------------


def test_signed_request_creates_an_autoscaler_job(
    anonymous: TestClient, client: TestClient, db_engine: Engine, d1: str
) -> None:
    response = signed(anonymous, {"deployment": "d1", "target_dp_size": 3, "reason": "queue depth"})
    assert response.status_code == 202, response.text
    outcome = response.json()
    assert outcome["decision"] == "accepted" and outcome["target_dp_size"] == 3
    assert response.headers["location"] == f"/v1/reconfigurations/{outcome['job_id']}"
    [job] = jobs(db_engine)
    assert (job.id, job.to_dp_size, job.requested_by) == (outcome["job_id"], 3, "autoscaler")
    assert "queue depth" in (job.reason or "")
    assert last_request(client)["decision"] == "accepted"


def test_step_is_relative_to_the_current_size(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    assert signed(anonymous, {"deployment": "d1", "step": "+1"}).status_code == 202
    assert jobs(db_engine)[0].to_dp_size == 3


def test_per_deployment_secret_signs_for_its_deployment(
    anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    assert signed(anonymous, {"deployment": "d1", "step": -1}, secret=D1_SECRET).status_code == 202


def test_per_deployment_secret_does_not_sign_for_another(
    anonymous: TestClient, client: TestClient, db_engine: Engine, d1: str
) -> None:
    make_deployment(client, db_engine, "d2")
    response = signed(anonymous, {"deployment": "d2", "step": 1}, secret=D1_SECRET)
    assert_problem(response, 401, "bad-signature")
    assert jobs(db_engine) == []


def test_bad_signature_is_401_and_creates_nothing(
    anonymous: TestClient, client: TestClient, db_engine: Engine, d1: str
) -> None:
    response = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}, secret=signing.generate_secret())
    assert_problem(response, 401, "bad-signature")
    assert jobs(db_engine) == []
    recorded = last_request(client)
    assert (recorded["decision"], recorded["job_id"]) == ("rejected", None)


def test_tampered_body_is_a_bad_signature(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    raw = json.dumps({"deployment": "d1", "target_dp_size": 3}).encode()
    headers = signing.signature_headers(GLOBAL_SECRET, "msg_t", int(time.time()), raw)
    response = anonymous.post("/v1/hooks/scale", content=raw.replace(b"3", b"4"), headers=headers)
    assert_problem(response, 401, "bad-signature")
    assert jobs(db_engine) == []


def test_stale_timestamp_is_401_and_creates_nothing(
    anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    response = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}, timestamp=int(time.time()) - 301)
    assert_problem(response, 401, "stale-timestamp")
    assert jobs(db_engine) == []


def test_replayed_webhook_id_is_409_and_creates_nothing_more(
    anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    body = {"deployment": "d1", "target_dp_size": 3}
    assert signed(anonymous, body, message_id="msg_once").status_code == 202
    finish(db_engine, jobs(db_engine)[0].id)
    assert_problem(signed(anonymous, body, message_id="msg_once"), 409, "replayed-webhook-id")
    assert len(jobs(db_engine)) == 1


def test_unsigned_request_without_token_is_401(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    response = anonymous.post("/v1/hooks/scale", json={"deployment": "d1", "target_dp_size": 3})
    assert_problem(response, 401, "missing-credentials")
    assert jobs(db_engine) == []


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"not json", "not JSON"),
        ({"deployment": "d1"}, "exactly one"),
        ({"deployment": "d1", "target_dp_size": 3, "step": 1}, "exactly one"),
        ({"deployment": "d1", "step": 0}, "zero"),
        ({"deployment": "d1", "step": "up"}, "signed integer"),
        ({"deployment": "d1", "target_dp_size": -2}, "greater than"),
        ({"deployment": "d1", "target_dp_size": 3, "extra": True}, "extra"),
        ([1, 2, 3], "scale request"),
    ],
)
def test_malformed_signed_body_is_422_and_creates_nothing(
    anonymous: TestClient, db_engine: Engine, d1: str, body: Any, words: str
) -> None:
    response = signed(anonymous, body)
    assert_problem(response, 422, "malformed-hook-body")
    assert words in response.json()["detail"]
    assert jobs(db_engine) == []


def test_unknown_deployment_is_404_and_recorded(anonymous: TestClient, client: TestClient, d1: str) -> None:
    response = signed(anonymous, {"deployment": "nope", "target_dp_size": 3})
    assert_problem(response, 404, "unknown-deployment")
    assert last_request(client)["id"] == response.json()["request_id"]


# --- generic, bearer --------------------------------------------------------------------------------


def test_autoscaler_token_may_scale_without_a_signature(
    client: TestClient, anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    headers = token_headers(client, "autoscaler", "keda")
    response = anonymous.post("/v1/hooks/scale", json={"deployment": "d1", "step": "-1"}, headers=headers)
    assert response.status_code == 202, response.text
    assert jobs(db_engine)[0].requester == "keda"


def test_viewer_token_may_not_scale(
    client: TestClient, anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    headers = token_headers(client, "viewer")
    response = anonymous.post("/v1/hooks/scale", json={"deployment": "d1", "step": 1}, headers=headers)
    assert_problem(response, 403, "forbidden")
    assert jobs(db_engine) == []


def test_unknown_token_is_401(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    response = anonymous.post(
        "/v1/hooks/scale", json={"deployment": "d1", "step": 1}, headers={"Authorization": "Bearer nope"}
    )
    assert_problem(response, 401, "invalid-token")


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


def test_request_while_a_job_is_active_is_ignored(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    first = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()
    response = signed(anonymous, {"deployment": "d1", "target_dp_size": 4})
    assert response.status_code == 200 and response.json()["code"] == "active-job"
    assert first["job_id"] in response.json()["reason"]
    assert len(jobs(db_engine)) == 1


def test_request_inside_the_cooldown_is_ignored_with_the_time_left(
    anonymous: TestClient, client: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    first = signed(anonymous, {"deployment": "d1", "target_dp_size": 3}).json()
    finish(db_engine, first["job_id"])
    response = signed(anonymous, {"deployment": "d1", "target_dp_size": 4})
    assert response.status_code == 200 and response.json()["code"] == "cooldown"
    assert "of 600 s left" in response.json()["reason"]
    assert len(jobs(db_engine)) == 1


def test_cooldown_counts_only_autoscaler_jobs(
    client: TestClient, anonymous: TestClient, db_engine: Engine
) -> None:
    make_deployment(client, db_engine, "d1", cooldown_s=600)
    operator_job = client.post("/v1/reconfigurations", json={"deployment": "d1", "target_dp_size": 3}).json()
    finish(db_engine, operator_job["id"])
    assert signed(anonymous, {"deployment": "d1", "target_dp_size": 4}).status_code == 202


# --- Alertmanager -----------------------------------------------------------------------------------


@pytest.fixture
def alertmanager_headers(client: TestClient) -> dict[str, str]:
    return token_headers(client, "autoscaler", "alertmanager")


def post_alerts(anonymous: TestClient, headers: dict[str, str], body: Any) -> Any:
    if isinstance(body, bytes):
        return anonymous.post("/v1/hooks/alertmanager", content=body, headers=headers)
    return anonymous.post("/v1/hooks/alertmanager", json=body, headers=headers)


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


def test_resolved_alert_is_recorded_as_ignored_and_scales_nothing(
    anonymous: TestClient,
    client: TestClient,
    alertmanager_headers: dict[str, str],
    db_engine: Engine,
    d1: str,
) -> None:
    response = post_alerts(anonymous, alertmanager_headers, resolved_payload("d1"))
    assert response.status_code == 200
    [result] = response.json()["results"]
    assert (result["decision"], result["code"]) == ("ignored", "alert-skipped")
    assert "resolved" in result["reason"]
    assert jobs(db_engine) == []
    assert last_request(client)["source"] == "alertmanager"


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


def test_alert_for_an_unknown_deployment_is_recorded_and_answered_200(
    anonymous: TestClient, alertmanager_headers: dict[str, str], db_engine: Engine, d1: str
) -> None:
    response = post_alerts(anonymous, alertmanager_headers, firing_payload("ghost", scale="up"))
    assert response.status_code == 200
    assert response.json()["results"][0]["code"] == "unknown-deployment"


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


# --- the record -------------------------------------------------------------------------------------


def test_every_request_is_listed_with_its_decision_and_filterable(
    anonymous: TestClient, client: TestClient, alertmanager_headers: dict[str, str], d1: str
) -> None:
    signed(anonymous, {"deployment": "d1", "target_dp_size": 3})
    signed(anonymous, {"deployment": "d1", "target_dp_size": 4})
    signed(anonymous, {"deployment": "d1", "target_dp_size": 4}, secret=signing.generate_secret())
    post_alerts(anonymous, alertmanager_headers, resolved_payload("d1"))
    listed = client.get("/v1/hooks/requests").json()
    assert listed["count"] == 4
    assert [r["decision"] for r in listed["data"]] == ["ignored", "rejected", "ignored", "accepted"]
    rejected = client.get("/v1/hooks/requests", params={"decision": "rejected"}).json()
    assert rejected["count"] == 1 and rejected["data"][0]["details"]["code"] == "bad-signature"
    assert client.get("/v1/hooks/requests", params={"source": "alertmanager"}).json()["count"] == 1


# --- never 5xx --------------------------------------------------------------------------------------

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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=JSON)
@example(body={"\x00": None})  # a NUL in a field name once made Postgres refuse the record: a 500
def test_signed_scale_answers_4xx_or_2xx_to_any_json(anonymous: TestClient, d1: str, body: Any) -> None:
    response = signed(anonymous, body)
    assert response.status_code < 500, response.text
