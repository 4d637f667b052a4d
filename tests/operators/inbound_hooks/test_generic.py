"""Inbound generic scale hooks: a signed request (or an autoscaler's bearer token) makes an autoscaler
job; a bad signature, a stale or replayed message, a malformed body or a token without the right is
refused with a 4xx problem and creates nothing."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from app.webhooks import signing
from tests.operators.inbound_hooks.support import (
    D1_SECRET,
    GLOBAL_SECRET,
    assert_problem,
    finish,
    jobs,
    last_request,
    make_deployment,
    signed,
)
from tests.support.fixtures import token_headers

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
    # An unauthenticated caller is counted, never stored: it cannot grow the database.
    assert client.get("/v1/hooks/requests").json()["count"] == 0
    assert (
        'epctl_inbound_hook_requests_total{decision="rejected",source="generic"}'
        in client.get("/metrics").text
    )


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


@pytest.mark.databases("sqlite", "postgres")
def test_a_copy_of_a_signed_request_is_a_duplicate_linked_to_its_decision(
    anonymous: TestClient, client: TestClient, db_engine: Engine, d1: str
) -> None:
    body = {"deployment": "d1", "target_dp_size": 3}
    first = signed(anonymous, body, message_id="msg_once")
    assert first.status_code == 202
    finish(db_engine, jobs(db_engine)[0].id)
    for _ in range(3):  # Standard Webhooks senders retry with the same webhook-id: a 2xx stops them
        again = signed(anonymous, body, message_id="msg_once")
        assert again.status_code == 200, again.text
        assert (again.json()["decision"], again.json()["code"]) == ("ignored", "duplicate")
        assert again.json()["duplicate_of"] == first.json()["request_id"]
    assert len(jobs(db_engine)) == 1
    listed = client.get("/v1/hooks/requests").json()["data"]
    assert [r["duplicate_of"] for r in listed] == [first.json()["request_id"]] * 3 + [None]


def test_a_webhook_id_reused_with_another_body_is_409_and_changes_nothing(
    anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    assert signed(anonymous, {"deployment": "d1", "target_dp_size": 3}, message_id="msg_1").status_code == 202
    finish(db_engine, jobs(db_engine)[0].id)
    reused = signed(anonymous, {"deployment": "d1", "target_dp_size": 4}, message_id="msg_1")
    assert_problem(reused, 409, "replayed-webhook-id")
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
