"""Reusable pytest fixtures for coordinator-side tests, a plugin of the whole suite (`tests/conftest.py`):

- `database_url`: a migrated database with no rows, this test's alone, on SQLite, and on Postgres too where
  the test is marked `databases("sqlite", "postgres")` (the rule: `tests/support/databases.py`; the
  backend is in the test id); `empty_database_url`: a fresh database with no tables.
- `db_engine`, `session`: on that database.
- `settings`, `app`, `client`: the coordinator's API on that database (already at head, so start-up does
  not migrate), background workers off; `client` is a TestClient whose requests carry the admin token
  (`ADMIN_TOKEN`).
  `token_headers(client, role)` makes a token of another role.
- `agent_zygote`: one warmed interpreter per session that test agents are forked from (tests/agent's
  `spawn_agents`, tests/e2e/test_tls.py's own agents): torch imported once per run, not once per agent.
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
from tests.support import processes
from tests.support.agent_zygote import Zygote
from tests.support.databases import (
    SharedPostgresSchema,
    postgres_schema,
    postgres_unavailable_reason,
    remove_sqlite_template,
    sqlite_database,
)
from tests.support.processes import ADMIN_TOKEN, AGENT_KEY

ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _require_postgres() -> None:
    reason = postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def sqlite_template_cleanup() -> Iterator[None]:
    yield
    remove_sqlite_template()


@pytest.fixture(scope="session")
def shared_postgres_schema() -> Iterator[SharedPostgresSchema]:
    _require_postgres()
    shared = SharedPostgresSchema()
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def database_url(db_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database at the newest migration with no rows, this test's alone."""
    if db_backend == "sqlite":
        return sqlite_database(tmp_path, migrated=True)
    _require_postgres()
    shared: SharedPostgresSchema = request.getfixturevalue("shared_postgres_schema")
    return shared.reset()


@pytest.fixture
def empty_database_url(db_backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database (no tables), this test's alone."""
    if db_backend == "sqlite":
        yield sqlite_database(tmp_path, migrated=False)
        return
    _require_postgres()
    with postgres_schema(migrated=False) as url:
        yield url


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
    """The database is at head already: start-up need not run Alembic (`auto_migrate` off)."""
    return Settings(
        database_url=database_url, data_dir=tmp_path / "data", admin_token=ADMIN_TOKEN, auto_migrate=False
    )


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


class _SessionZygote:
    """The session's one agent zygote, started on first use."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._factory = tmp_path_factory
        self.zygote: Zygote | None = None

    def get(self) -> Zygote:
        if self.zygote is None:
            # Every forked agent holds this environment (and /proc/PID/environ shows it): no coordinator
            # setting or secret of this process, only what a test agent needs.
            env = processes.clean_environment({processes.ZYGOTE_SETTING: ""})  # "": not the zygote itself
            del env[processes.ZYGOTE_SETTING]
            env |= {"OMP_NUM_THREADS": "1", "EPCTL_AGENT_KEY": AGENT_KEY}
            self.zygote = Zygote(self._factory.mktemp("agent-zygote"), env)
        return self.zygote

    def socket_path(self) -> str:
        return self.get().socket_path


@pytest.fixture(scope="session", autouse=True)
def _session_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_SessionZygote]:
    """Every coordinator and `epctl up` the harness starts forks its local agents from the session's
    zygote (`processes.agent_zygote_socket`); it starts with the first of them (never in-process only)."""
    session = _SessionZygote(tmp_path_factory)
    processes.agent_zygote_socket = session.socket_path
    yield session
    processes.agent_zygote_socket = None
    if session.zygote is not None:
        session.zygote.close()


@pytest.fixture(scope="session")
def agent_zygote(_session_zygote: _SessionZygote) -> Zygote:
    """One warmed interpreter per session that test agents are forked from (tests/support/agent_zygote.py)."""
    return _session_zygote.get()
