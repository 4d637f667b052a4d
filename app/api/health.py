from __future__ import annotations

import anyio
import sqlalchemy as sa
from fastapi import APIRouter

from app.api.deps import DatabaseDep
from app.core.db import schema_is_current
from app.core.errors import UnavailableError
from app.core.problems import problem_responses

router = APIRouter(tags=["health"])


class NotReadyError(UnavailableError):
    code = "not-ready"


@router.get("/healthz", name="alive")
async def healthz() -> dict[str, str]:
    """The process is alive (no dependencies checked; answered ahead of routing, never waits for the
    database or a worker thread)."""
    return {"status": "ok"}


@router.get("/readyz", name="ready", responses=problem_responses(503))
async def readyz(db: DatabaseDep) -> dict[str, str]:
    """The database answers and its schema is at the newest migration."""
    engine = db.engine

    def check() -> bool:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        return schema_is_current(engine)

    try:
        current = await anyio.to_thread.run_sync(check, limiter=db.limiter)
    except Exception as exc:
        raise NotReadyError(f"database unreachable: {type(exc).__name__}: {exc}") from None
    if not current:
        raise NotReadyError(
            "database schema is not at the newest migration: run `epctl serve` or `alembic upgrade head`"
        )
    return {"status": "ready"}
