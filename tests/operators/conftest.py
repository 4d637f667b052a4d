"""Fixtures for the operators' tests: the shared coordinator fixtures (a database per test, see
`tests/support/fixtures.py`; `session`, `client`, ...) plus a deployment row to hang jobs on."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from tests.operators import rows


@pytest.fixture
def engine(db_engine: Engine) -> Engine:
    return db_engine


@pytest.fixture
def deployment_id(session: Session) -> str:
    return rows.make_deployment(session, "d1").id
