"""A job's background cleanup, as the record and the operator see it.

After a job switches, each engine of the old generation destroys the retired groups in its own
background worker; the reference backend follows the outcome onto the job
(`app.backends.reference.cleanup`). A failure blocks the deployment's next job
(`check_no_unresolved_cleanup`, called by the create service) until an operator retries or
acknowledges it: the backend asks the engine, and the record keeps the resolution (`failed_cleanup`,
`record_resolution`). Nothing here calls an agent.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, select

from app.core.errors import ConflictError, NotFoundError
from app.deployments.engines.models import Engine
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


def failed_cleanup(session: Session, job_id: str) -> tuple[ReconfigurationJob, Engine | None]:
    """The job whose cleanup failed and the engine it failed on (None if no longer recorded); raises
    `NotFoundError`, or `NoCleanupFailureError` when its cleanup did not fail."""
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


def record_resolution(
    session: Session,
    job: ReconfigurationJob,
    *,
    retry: bool,
    actor: str | None,
    engine_id: str | None,
    agent_answer: dict[str, Any] | None,
) -> ReconfigurationJob:
    """An operator's retry (cleanup `running` again) or acknowledgement (`acknowledged`: the deployment is
    unblocked), with what the engine answered; the job as it is now."""
    new_state = CleanupState.running.value if retry else CleanupState.acknowledged.value
    action = "retry" if retry else "acknowledge"
    cleanup = dict(job.cleanup or {})
    cleanup.setdefault("resolutions", []).append({"action": action, "by": actor, "agent": agent_answer})
    append_event(
        session,
        job_id=job.id,
        kind="cleanup",
        message=f"cleanup {action} by {actor or 'an operator'}",
        data={"action": action, "engine_id": engine_id},
        changes={"cleanup_state": new_state, "cleanup": cleanup},
    )
    refreshed = session.get(ReconfigurationJob, job.id, populate_existing=True)
    assert refreshed is not None
    return refreshed
