"""Fixtures for the operators' tests: a migrated database (SQLite and Postgres) and rows to act on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core.db import make_engine, migrate_to_head
from tests.operators import rows


@pytest.fixture
def database_url(tmp_path: object) -> str:
    url = f"sqlite:///{tmp_path}/operators.db"  # type: ignore[str-bytes-safe]
    migrate_to_head(url)
    return url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        yield session


@pytest.fixture
def deployment_id(session: Session) -> str:
    return rows.make_deployment(session, "d1").id
