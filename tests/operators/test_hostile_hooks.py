"""Issue 17, findings 2, 3, 5 and 7 on the inbound hooks: hostile bodies get 4xx (never 5xx), a failed
hook creates nothing, anonymous failures store nothing, and copies of one signed request are decided
once, atomically (the others are duplicates of that decision)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from app.core.config import Settings
from app.scale.hooks.models import InboundHookRequest
from app.webhooks import signing
from tests.operators.alertmanager_payloads import alert, payload
from tests.operators.inbound_hooks import support as inbound
from tests.operators.inbound_hooks.support import GLOBAL_SECRET, jobs, signed
from tests.support.fixtures import ADMIN_TOKEN, token_headers

# The database's own behaviour is part of what these check (tests/support/databases.py).
pytestmark = pytest.mark.databases("sqlite", "postgres")


# As in tests/operators/inbound_hooks: inbound secrets configured, an anonymous client, deployment d1.
@pytest.fixture(name="settings")
def settings_with_inbound_secrets(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    return Settings(
        database_url=database_url,
        data_dir=tmp_path / "data",
        admin_token=ADMIN_TOKEN,
        hooks_inbound_secret=GLOBAL_SECRET,
        webhook_worker_enabled=False,
    )


@pytest.fixture(name="anonymous")
def anonymous_client(app: FastAPI, client: TestClient) -> TestClient:
    return TestClient(app)


@pytest.fixture(name="d1")
def deployment_d1(client: TestClient, db_engine: Engine) -> str:
    return inbound.make_deployment(client, db_engine, "d1")


def stored_requests(db_engine: Engine) -> int:
    with Session(db_engine) as session:
        return int(session.exec(select(func.count()).select_from(InboundHookRequest)).one())


def post_raw(client: TestClient, path: str, raw: bytes, headers: dict[str, str] | None = None) -> Any:
    return client.post(path, content=raw, headers={"content-type": "application/json", **(headers or {})})


# --- finding 2: never 5xx, even to anonymous callers ---------------------------------------------------


def test_deeply_nested_json_is_a_4xx_problem(anonymous: TestClient, d1: str) -> None:
    for depth in (100, 50_000):
        response = post_raw(anonymous, "/v1/hooks/scale", b"[" * depth + b"]" * depth)
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "json-too-deep"


def test_an_integer_of_4300_digits_is_a_4xx_problem(anonymous: TestClient, d1: str) -> None:
    raw = b'{"deployment": "d1", "target_dp_size": 1' + b"0" * 4300 + b"}"
    response = signed(anonymous, raw)
    assert response.status_code == 422 and response.json()["code"] == "integer-out-of-range"


def test_an_alertmanager_label_value_superscript_two_is_a_422_not_a_500(
    client: TestClient, anonymous: TestClient, d1: str
) -> None:
    headers = token_headers(client, "autoscaler", "am")
    for key in ("target_dp_size", "step"):
        body = payload([alert(deployment="d1", labels={key: "²"})])
        response = anonymous.post("/v1/hooks/alertmanager", json=body, headers=headers)
        assert response.status_code == 422, response.text
        assert response.json()["results"][0]["code"] == "unusable-labels"


# --- finding 3: a failed hook creates no job; its refusal is recorded once ---------------------------


def test_a_step_beyond_64_bits_creates_no_job_and_is_recorded_once(
    client: TestClient, anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    for step in (2**63, -(2**64), 10**30):
        raw = json.dumps({"deployment": "d1", "step": step}).encode()
        response = signed(anonymous, raw)
        assert response.status_code == 422, response.text
    headers = token_headers(client, "autoscaler", "scaler")
    response = anonymous.post("/v1/hooks/scale", json={"deployment": "d1", "step": 5000}, headers=headers)
    assert response.status_code == 422 and response.json()["code"] == "malformed-hook-body"
    assert jobs(db_engine) == []
    # 64-bit overflows are refused before authentication (nothing stored); the authenticated 5000 once.
    assert stored_requests(db_engine) == 1


def test_a_job_and_its_acceptance_record_commit_together(
    client: TestClient, anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    assert signed(anonymous, {"deployment": "d1", "step": 1}).status_code == 202
    accepted = client.get("/v1/hooks/requests").json()["data"]
    assert [(r["decision"], r["job_id"]) for r in accepted] == [("accepted", jobs(db_engine)[0].id)]


# --- finding 5: anonymous callers cannot grow the database ------------------------------------------


def test_anonymous_failures_store_nothing(anonymous: TestClient, db_engine: Engine, d1: str) -> None:
    body = {"deployment": "d1", "target_dp_size": 3}
    statuses: list[int] = []
    for _ in range(20):
        statuses.append(signed(anonymous, body, secret=signing.generate_secret()).status_code)
        statuses.append(post_raw(anonymous, "/v1/hooks/scale", json.dumps(body).encode()).status_code)
        bad_token = {"Authorization": "Bearer not-a-token"}
        statuses.append(anonymous.post("/v1/hooks/alertmanager", json={}, headers=bad_token).status_code)
    # Refused, then throttled once this client has failed too often (issue 32): never stored either way.
    assert statuses[:9] == [401] * 9 and set(statuses) == {401, 429}, statuses
    assert stored_requests(db_engine) == 0
    assert jobs(db_engine) == []


# --- finding 7: concurrent copies of one signed request ---------------------------------------------


def test_concurrent_copies_of_one_signed_request_give_one_job_and_one_record(
    anonymous: TestClient, db_engine: Engine, d1: str
) -> None:
    raw = json.dumps({"deployment": "d1", "target_dp_size": 3}).encode()
    headers = signing.signature_headers(GLOBAL_SECRET, "msg_copy", int(time.time()), raw)
    headers["content-type"] = "application/json"

    def send(_: int) -> int:
        return int(post_raw(anonymous, "/v1/hooks/scale", raw, headers).status_code)

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(send, range(16)))
    # One decision; every other copy a duplicate of it (2xx, so a Standard Webhooks sender stops).
    assert sorted(statuses) == [200] * 15 + [202], statuses
    assert len(jobs(db_engine)) == 1
    with Session(db_engine) as session:
        copy_id = InboundHookRequest.webhook_id == "msg_copy"
        [decided] = session.exec(select(InboundHookRequest).where(copy_id)).all()
        copies = session.exec(
            select(InboundHookRequest).where(InboundHookRequest.duplicate_of == decided.id)
        ).all()
    assert decided.decision == "accepted" and len(copies) == 15
