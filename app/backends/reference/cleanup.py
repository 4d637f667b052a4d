"""The reference engines' background cleanup of retired groups, seen from the coordinator.

- Followed (the backend's periodic task `cleanup`): each engine's `GET /v1/cleanup` onto the job that
  retired the groups (`cleanup_state` pending -> running -> succeeded or failed). A failure is written
  once, with an event and the outbox event `reconfiguration.cleanup_failed`; it then blocks the
  deployment's next job until an operator resolves it (`app.jobs.cleanup`).
- Resolved (`retry_cleanup`, `acknowledge_cleanup`, behind `cleanup_router.py`): the engine where it
  failed is asked to destroy the groups again, or to drop them; the record keeps the resolution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.agents.client import AgentClient
from app.agents.errors import AgentCallError
from app.agents.fleet import Fleet
from app.core.errors import ConflictError
from app.deployments.agent_keys import agent_keys_of
from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment
from app.jobs import cleanup
from app.jobs.async_record import WorkerSessions
from app.jobs.models import CleanupState, ReconfigurationJob
from app.jobs.transitions import append_event
from app.webhooks.models import EventType
from engine_agent.protocol import CleanupRecord, CleanupStatus

UNSETTLED = (CleanupState.pending.value, CleanupState.running.value)

# --- following the outcome ----------------------------------------------------------------------------


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


def _agent_keys(session: Session, deployment_id: str) -> tuple[str, ...]:
    deployment = session.get(Deployment, deployment_id)
    return agent_keys_of(deployment) if deployment is not None else ()


def _unsettled_jobs(session: Session) -> list[tuple[ReconfigurationJob, list[Engine], tuple[str, ...]]]:
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
        found.append((job, engines, _agent_keys(session, job.deployment_id)))
    return found


async def poll_cleanup_outcomes(record: WorkerSessions, new_fleet: Callable[[], Fleet]) -> None:
    """One pass over every job whose cleanup is unsettled."""
    pending = await record.run_in_session(_unsettled_jobs)
    if not pending:
        return
    async with new_fleet() as fleet:
        for job, engines, keys in pending:
            await _poll_one(record, fleet, job, engines, keys)


async def _poll_one(
    record: WorkerSessions,
    fleet: Fleet,
    job: ReconfigurationJob,
    engines: Sequence[Engine],
    keys: Sequence[str],
) -> None:
    clients = [fleet.client(e.id, e.url, keys) for e in engines]
    results = await fleet.each(clients, lambda c: c.cleanup_status())
    per_engine: dict[str, dict[str, Any]] = {}
    failed: tuple[str, CleanupRecord] | None = None
    states = []
    for engine_id, result in results.items():
        if isinstance(result, AgentCallError):
            # An engine gone (stopped after scale-down) took its groups with it.
            per_engine[engine_id] = {"state": "unknown", "error": result.message}
            continue
        state, newest = outcome_for(job.id, result)
        states.append(state)
        per_engine[engine_id] = {"state": state, **({"record": newest.model_dump()} if newest else {})}
        if state == CleanupState.failed.value and newest is not None and failed is None:
            failed = (engine_id, newest)
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
        engine_id, failure = failed
        cleanup.update(
            failed_engine_id=engine_id,
            error=failure.error,
            failed_generation=failure.generation,
            failed_at=failure.finished_at,
        )
        message = f"cleanup of generation {failure.generation} failed on {engine_id}: {failure.error}"
        outbox: str | None = EventType.cleanup_failed.value
    else:
        message = f"cleanup {overall}"
        outbox = None
    await record.run_in_session(
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


# --- an operator's resolution ------------------------------------------------------------------------


async def retry_cleanup(db: DbEngine, job_id: str, *, actor: str | None = None) -> ReconfigurationJob:
    """Ask the failing engine to destroy the retired groups again; the outcome is polled as before."""
    return await _resolve(WorkerSessions(db), job_id, actor=actor, retry=True)


async def acknowledge_cleanup(db: DbEngine, job_id: str, *, actor: str | None = None) -> ReconfigurationJob:
    """Accept the failure as it is: the engine drops the retired groups, the deployment is unblocked."""
    return await _resolve(WorkerSessions(db), job_id, actor=actor, retry=False)


async def _resolve(
    sessions: WorkerSessions, job_id: str, *, actor: str | None, retry: bool
) -> ReconfigurationJob:
    def read(session: Session) -> tuple[ReconfigurationJob, Engine | None, tuple[str, ...]]:
        job, engine = cleanup.failed_cleanup(session, job_id)
        return job, engine, _agent_keys(session, job.deployment_id)

    job, engine, keys = await sessions.run_in_session(read)
    agent_answer: dict[str, Any] | None = None
    if engine is not None and engine.state != EngineState.left.value:
        async with AgentClient(engine.id, engine.url, keys=keys) as client:
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
    engine_id = engine.id if engine else None
    return await sessions.run_in_session(
        lambda s: cleanup.record_resolution(
            s, job, retry=retry, actor=actor, engine_id=engine_id, agent_answer=agent_answer
        )
    )
