from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, Depends
from sqlalchemy.engine import Engine

from app.api.deps import get_db_engine
from app.core.db import schema_is_current
from app.core.errors import UnavailableError
from app.core.problems import problem_responses

router = APIRouter(tags=["health"])


class NotReadyError(UnavailableError):
    code = "not-ready"


@router.get("/healthz", name="alive")
def healthz() -> dict[str, str]:
    """The process is alive (no dependencies checked)."""
    return {"status": "ok"}


@router.get("/readyz", name="ready", responses=problem_responses(503))
def readyz(engine: Engine = Depends(get_db_engine)) -> dict[str, str]:
    """The database answers and its schema is at the newest migration."""
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        current = schema_is_current(engine)
    except Exception as exc:
        raise NotReadyError(f"database unreachable: {type(exc).__name__}: {exc}") from None
    if not current:
        raise NotReadyError(
            "database schema is not at the newest migration: run `epctl serve` or `alembic upgrade head`"
        )
    return {"status": "ready"}
