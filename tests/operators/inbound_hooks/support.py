"""What the inbound hook tests share: the coordinator's inbound secrets, an anonymous client, deployment
d1 (fixtures, which this package's conftest offers to its tests) and helpers that send signed requests
and Alertmanager notifications and read what they made."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.core.config import Settings
from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationJob
from app.jobs.states import JobState
from app.jobs.transitions import transition
from app.webhooks import signing
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
    """Deployment d1: limits [1, 4], serving at DP size 2, four engines known, no cooldown, no
    scale-down window."""
    return make_deployment(client, db_engine, "d1")


def make_deployment(
    client: TestClient,
    db_engine: Engine,
    name: str,
    *,
    cooldown_s: float = 0.0,
    scale_down_window_s: float = 0.0,
    behavior: dict[str, Any] | None = None,
) -> str:
    """A static deployment at DP size 2 of four known engines. Its scale-down window is 0 s unless
    given (these tests are about other rules; the default window has tests of its own)."""
    if behavior is None:
        behavior = {"scale_down": {"stabilization_window_s": scale_down_window_s}}
    body = {
        "name": name,
        "launcher": "static",
        "min_dp_size": 1,
        "max_dp_size": 4,
        "autoscale_cooldown_s": cooldown_s,
        "autoscale_behavior": (
            behavior
            if behavior is not None
            else {"scale_down": {"stabilization_window_s": scale_down_window_s}}
        ),
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
        statement = select(ReconfigurationJob).order_by(col(ReconfigurationJob.created_at))
        return list(session.exec(statement).all())


def finish(db_engine: Engine, job_id: str) -> None:
    """End a pending job (cancelled: the deployment keeps its size)."""
    with Session(db_engine) as session:
        transition(session, job_id=job_id, from_state=JobState.pending, to_state=JobState.cancelled)


def succeed(db_engine: Engine, job_id: str) -> None:
    """End a pending job as if it ran: the deployment is at its target size."""
    with Session(db_engine) as session:
        job = session.get(ReconfigurationJob, job_id)
        assert job is not None
        deployment = session.get(Deployment, job.deployment_id)
        assert deployment is not None
        for to_state in (
            JobState.preparing,
            JobState.syncing,
            JobState.committing,
            JobState.cleaning_up,
            JobState.succeeded,
        ):
            transition(session, job_id=job_id, from_state=JobState(job.state), to_state=to_state)
            session.refresh(job)
        deployment.current_dp_size = job.to_dp_size
        deployment.generation = job.to_generation
        session.add(deployment)
        session.commit()


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


@pytest.fixture
def alertmanager_headers(client: TestClient) -> dict[str, str]:
    return token_headers(client, "autoscaler", "alertmanager")


def post_alerts(anonymous: TestClient, headers: dict[str, str], body: Any) -> Any:
    if isinstance(body, bytes):
        return anonymous.post("/v1/hooks/alertmanager", content=body, headers=headers)
    return anonymous.post("/v1/hooks/alertmanager", json=body, headers=headers)
