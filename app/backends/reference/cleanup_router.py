"""`POST /v1/reconfigurations/{id}/cleanup/retry|acknowledge`: resolve a job's failed background
cleanup on the reference engine where it failed, so its deployment may reconfigure again."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from sqlalchemy.engine import Engine

from app.api.database import Database
from app.api.deps import CleanupOperator, DatabaseDep, get_db_engine
from app.api.params import JobIdPath
from app.backends.reference import cleanup
from app.core.problems import problem_responses
from app.jobs import service
from app.jobs.models import JobPublic

router = APIRouter(
    prefix="/v1/reconfigurations", tags=["reconfigurations"], responses=problem_responses(401, 403, 422)
)

DbEngineDep = Annotated[Engine, Depends(get_db_engine)]


async def _public(database: Database, job_id: str) -> JobPublic:
    return await database.run(
        lambda session: service.job_public(session, service.get_job(session, job_id=job_id))
    )


@router.post("/{job_id}/cleanup/retry", name="cleanup_retry", responses=problem_responses(404, 409))
async def retry_cleanup(
    job_id: JobIdPath, db: DbEngineDep, database: DatabaseDep, principal: CleanupOperator
) -> JobPublic:
    """Run the failed cleanup again on the engine where it failed; its outcome is followed as before
    (`cleanup_state` running, then succeeded or failed)."""
    await cleanup.retry_cleanup(db, job_id, actor=principal.name)
    return await _public(database, job_id)


@router.post(
    "/{job_id}/cleanup/acknowledge", name="cleanup_acknowledge", responses=problem_responses(404, 409)
)
async def acknowledge_cleanup(
    job_id: JobIdPath, db: DbEngineDep, database: DatabaseDep, principal: CleanupOperator
) -> JobPublic:
    """Accept the failure as it is (the engine drops the retired groups); the deployment is unblocked."""
    await cleanup.acknowledge_cleanup(db, job_id, actor=principal.name)
    return await _public(database, job_id)
