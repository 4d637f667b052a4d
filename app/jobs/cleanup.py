"""A job's background cleanup, as the record and the operator see it.

After a job switches, each engine of the old generation destroys the retired groups in its own
background worker; the runner follows the outcome onto the job (`app.runner.scheduled`). A failure
blocks the deployment's next job (`check_no_unresolved_cleanup`, called by the create service) until
an operator retries or acknowledges it (`retry_cleanup`, `acknowledge_cleanup`, behind
`cleanup_router.py`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlmodel import Session, select

from app.agents.client import AgentClient
from app.agents.errors import AgentCallError
from app.core.errors import ConflictError, NotFoundError
from app.engines.models import Engine, EngineState
from app.jobs.models import CleanupState, ReconfigurationJob
from app.jobs.transitions import append_event


class CleanupFailedError(ConflictError):
    """The deployment's last retired groups failed to clean up; nothing new starts until resolved."""

    code = "cleanup-failed"
    title = "Unresolved cleanup failure"


class NoCleanupFailureError(ConflictError):
    code = "no-cleanup-failure"
    title = "No cleanup failure to resolve"


# --- the check the create service calls ---------------------------------------------------------------


def unresolved_cleanup_failure(session: Session, deployment_id: str) -> ReconfigurationJob | None:
    """The deployment's job whose cleanup failed and was neither retried nor acknowledged."""
    return session.exec(
        select(ReconfigurationJob)
        .where(
            ReconfigurationJob.deployment_id == deployment_id,
            ReconfigurationJob.cleanup_state == CleanupState.failed.value,
        )
        .order_by(ReconfigurationJob.created_at)  # type: ignore[arg-type]
    ).first()


def check_no_unresolved_cleanup(session: Session, deployment_id: str, deployment_name: str = "") -> None:
    """Raise `CleanupFailedError` (409, naming the job and engine) over an unresolved failure."""
    job = unresolved_cleanup_failure(session, deployment_id)
    if job is None:
        return
    info = job.cleanup or {}
    engine_id = info.get("failed_engine_id")
    error = info.get("error")
    raise CleanupFailedError(
        f"cleanup of generation {info.get('retired_generation')} retired by job {job.id} failed on engine "
        f"{engine_id}: {error}. Retry it (POST /v1/reconfigurations/{job.id}/cleanup/retry) or acknowledge "
        f"it (POST /v1/reconfigurations/{job.id}/cleanup/acknowledge) before scaling "
        f"{deployment_name or 'this deployment'} again",
        failed_job_id=job.id,
        engine_id=engine_id,
        cleanup_error=error,
    )


# --- operator actions ---------------------------------------------------------------------------------


def _failed_job(session: Session, job_id: str) -> tuple[ReconfigurationJob, Engine | None]:
    job = session.get(ReconfigurationJob, job_id)
    if job is None:
        raise NotFoundError(f"no reconfiguration {job_id}", code="job-not-found", job_id=job_id)
    if job.cleanup_state != CleanupState.failed.value:
        raise NoCleanupFailureError(
            f"job {job_id} has no unresolved cleanup failure (cleanup is {job.cleanup_state})",
            job_id=job_id,
            cleanup_state=job.cleanup_state,
        )
    engine_id = (job.cleanup or {}).get("failed_engine_id")
    engine = session.get(Engine, engine_id) if engine_id else None
    return job, engine


async def retry_cleanup(
    db_session_factory: Any, job_id: str, *, actor: str | None = None
) -> ReconfigurationJob:
    """Ask the failing engine to destroy the retired groups again; the outcome is polled as before."""
    return await _resolve(db_session_factory, job_id, actor=actor, retry=True)


async def acknowledge_cleanup(
    db_session_factory: Any, job_id: str, *, actor: str | None = None
) -> ReconfigurationJob:
    """Accept the failure as it is: the engine drops the retired groups, the deployment is unblocked."""
    return await _resolve(db_session_factory, job_id, actor=actor, retry=False)


async def _resolve(
    db_session_factory: Any, job_id: str, *, actor: str | None, retry: bool
) -> ReconfigurationJob:
    def read() -> tuple[ReconfigurationJob, Engine | None]:
        with db_session_factory() as session:
            return _failed_job(session, job_id)

    job, engine = await asyncio.to_thread(read)
    agent_answer: dict[str, Any] | None = None
    if engine is not None and engine.state != EngineState.left.value:
        async with AgentClient(engine.id, engine.url) as client:
            try:
                status = await (client.cleanup_retry() if retry else client.cleanup_acknowledge())
                agent_answer = status.model_dump(mode="json")
            except AgentCallError as exc:
                if retry:
                    raise ConflictError(
                        f"engine {engine.id} did not accept the cleanup retry: {exc.message}",
                        code="agent-error",
                        job_id=job_id,
                        engine_id=engine.id,
                    ) from exc
                agent_answer = {"error": exc.message}
    new_state = CleanupState.running.value if retry else CleanupState.acknowledged.value
    action = "retry" if retry else "acknowledge"

    def write() -> ReconfigurationJob:
        with db_session_factory() as session:
            cleanup = dict(job.cleanup or {})
            cleanup.setdefault("resolutions", []).append(
                {"action": action, "by": actor, "agent": agent_answer}
            )
            append_event(
                session,
                job_id=job_id,
                kind="cleanup",
                message=f"cleanup {action} by {actor or 'an operator'}",
                data={"action": action, "engine_id": engine.id if engine else None},
                changes={"cleanup_state": new_state, "cleanup": cleanup},
            )
            refreshed = session.get(ReconfigurationJob, job_id, populate_existing=True)
            assert refreshed is not None
            return refreshed

    return await asyncio.to_thread(write)
