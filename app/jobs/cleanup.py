"""Background cleanup outcomes: from the agents back to the job that retired the groups.

After a job switches, each engine of the old generation destroys the retired groups in its own
background worker. The job may already be `succeeded` while that runs. The runner polls the agents'
`GET /v1/cleanup` and writes the outcome to the job (`cleanup_state` pending -> running -> succeeded
or failed). A failure is written once, with an event and the outbox event
`reconfiguration.cleanup_failed`, and blocks the deployment's next job (`check_no_unresolved_cleanup`,
called by the create service) until an operator retries or acknowledges it (`retry_cleanup`,
`acknowledge_cleanup`, behind `cleanup_router.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, select

from app.agents.client import AgentCallError, AgentClient
from app.agents.fleet import Fleet
from app.core.errors import ConflictError, NotFoundError
from app.engines.models import Engine, EngineState
from app.jobs.models import CleanupState, ReconfigurationJob
from app.jobs.states import append_event
from app.webhooks.models import EventType
from engine_agent.protocol import CleanupRecord, CleanupStatus

if TYPE_CHECKING:
    from app.jobs.runner import JobRunner

UNSETTLED = (CleanupState.pending.value, CleanupState.running.value)


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


# --- polling outcomes ---------------------------------------------------------------------------------


def outcome_for(job_id: str, status: CleanupStatus) -> tuple[str, CleanupRecord | None]:
    """One engine's cleanup of `job_id`'s retired groups: (state, its newest record)."""
    if status.failure is not None and status.failure.job_id == job_id:
        return CleanupState.failed.value, status.failure
    newest = next((r for r in status.recent if r.job_id == job_id), None)
    if newest is not None and newest.ok:
        return CleanupState.succeeded.value, newest
    if newest is not None and not newest.ok and status.failure is None:
        # Its failure was acknowledged, or a retry is queued: running unless the queue is empty.
        if status.pending_generations:
            return CleanupState.running.value, newest
        return CleanupState.acknowledged.value, newest
    if status.pending_generations:
        return CleanupState.running.value, None
    # Nothing recorded and nothing queued: this engine had nothing of that job's to destroy.
    return CleanupState.succeeded.value, None


def _unsettled_jobs(session: Session) -> list[tuple[ReconfigurationJob, list[Engine]]]:
    jobs = session.exec(
        select(ReconfigurationJob).where(ReconfigurationJob.cleanup_state.in_(UNSETTLED))  # type: ignore[attr-defined]
    ).all()
    found = []
    for job in jobs:
        ids = list((job.cleanup or {}).get("engines", []))
        engines = [
            e
            for e in session.exec(select(Engine).where(Engine.id.in_(ids))).all()  # type: ignore[attr-defined]
            if e.state != EngineState.left.value
        ]
        found.append((job, engines))
    return found


async def poll_cleanup_outcomes(runner: JobRunner) -> None:
    """One pass over every job whose cleanup is unsettled."""
    pending = await runner._db(_unsettled_jobs)
    if not pending:
        return
    async with runner.fleet() as fleet:
        for job, engines in pending:
            await _poll_one(runner, fleet, job, engines)


async def _poll_one(
    runner: JobRunner, fleet: Fleet, job: ReconfigurationJob, engines: Sequence[Engine]
) -> None:
    clients = [fleet.client(e.id, e.url) for e in engines]
    results = await fleet.each(clients, lambda c: c.cleanup_status())
    per_engine: dict[str, dict[str, Any]] = {}
    failed: tuple[str, CleanupRecord] | None = None
    states = []
    for engine_id, result in results.items():
        if isinstance(result, AgentCallError):
            # An engine gone (stopped after scale-down) took its groups with it.
            per_engine[engine_id] = {"state": "unknown", "error": result.message}
            continue
        state, record = outcome_for(job.id, result)
        states.append(state)
        per_engine[engine_id] = {"state": state, **({"record": record.model_dump()} if record else {})}
        if state == CleanupState.failed.value and record is not None and failed is None:
            failed = (engine_id, record)
    if failed is not None:
        overall = CleanupState.failed.value
    elif CleanupState.running.value in states:
        overall = CleanupState.running.value
    elif CleanupState.acknowledged.value in states:
        overall = CleanupState.acknowledged.value
    else:
        overall = CleanupState.succeeded.value
    if overall == job.cleanup_state:
        return
    cleanup = dict(job.cleanup or {})
    cleanup["per_engine"] = per_engine
    if failed is not None:
        engine_id, record = failed
        cleanup.update(
            failed_engine_id=engine_id,
            error=record.error,
            failed_generation=record.generation,
            failed_at=record.finished_at,
        )
        message = f"cleanup of generation {record.generation} failed on {engine_id}: {record.error}"
        outbox: str | None = EventType.cleanup_failed.value
    else:
        message = f"cleanup {overall}"
        outbox = None
    await runner._db(
        lambda s: append_event(
            s,
            job_id=job.id,
            kind="cleanup",
            message=message,
            data={"cleanup_state": overall, "per_engine": per_engine},
            changes={"cleanup_state": overall, "cleanup": cleanup},
            outbox_type=outbox,
        )
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
    import asyncio

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


def engines_by_id(session: Session, ids: Sequence[str]) -> list[Engine]:
    return list(session.exec(select(Engine).where(Engine.id.in_(list(ids)))).all())  # type: ignore[attr-defined]
