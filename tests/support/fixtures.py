"""Reusable pytest fixtures for coordinator-side tests. Use them from a conftest with
`from tests.support.fixtures import *  # noqa: F403`.

- `database_url`: a fresh, migrated database, parametrised over SQLite and Postgres ("sqlite"/"postgres"
  in the test id); `empty_database_url`: the same, unmigrated.
- `db_engine`, `session`: on that database.
- `settings`, `app`, `client`: the coordinator's API on that database, background workers off; `client`
  is a TestClient whose requests carry the admin token (`ADMIN_TOKEN`).
  `token_headers(client, role)` makes a token of another role.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core.config import Settings
from app.core.db import make_engine
from app.main import create_app
from tests.support.databases import (
    postgres_schema,
    postgres_unavailable_reason,
    remove_sqlite_template,
    sqlite_database,
)

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def _database(backend: str, tmp_path: Path, *, migrated: bool) -> Iterator[str]:
    if backend == "sqlite":
        yield sqlite_database(tmp_path, migrated=migrated)
        return
    reason = postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with postgres_schema(migrated=migrated) as url:
        yield url


@pytest.fixture(scope="session", autouse=True)
def _sqlite_template_cleanup() -> Iterator[None]:
    yield
    remove_sqlite_template()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh database at the newest migration, this test's alone."""
    yield from _database(backend, tmp_path, migrated=True)


@pytest.fixture
def empty_database_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database (no tables), this test's alone."""
    yield from _database(backend, tmp_path, migrated=False)


@pytest.fixture
def db_engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def session(db_engine: Engine) -> Iterator[Session]:
    with Session(db_engine, expire_on_commit=False) as session:
        yield session


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(database_url=database_url, data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN)


@pytest.fixture
def app(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    """The coordinator's API alone: the job runner and the webhook delivery worker stay off, so jobs
    stay where a test puts them. Build your own with `create_app(settings)` to run them."""
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    return create_app(settings.model_copy(update={"webhook_worker_enabled": False}))


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, headers=ADMIN_HEADERS) as test_client:
        yield test_client


def token_headers(client: TestClient, role: str, name: str | None = None) -> dict[str, str]:
    """Create a token with `role` through the API (as admin) and return its Authorization header."""
    response = client.post("/v1/tokens", json={"name": name or f"{role}-token", "role": role})
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['token']}"}
