"""Periodic work the runner's loop ticks, each task at its own interval:

- `cleanup`: follow the background cleanup of retired groups from the agents (`GET /v1/cleanup`) onto
  the job that retired them (`cleanup_state` pending -> running -> succeeded or failed). A failure is
  written once, with an event and the outbox event `reconfiguration.cleanup_failed`; it then blocks
  the deployment's next job until an operator resolves it (`app.jobs.cleanup`).
- `heartbeats`: engines silent for longer than `EPCTL_HEARTBEAT_TIMEOUT_S` (counted from this
  coordinator's start at the earliest) become `unreachable`, a deployment that loses a member
  `degraded`, each announced as `engine.unreachable` (`app.engines.service.mark_unreachable`); then
  every deployment no job runs takes its status from what its engines report: `degraded` (webhook
  `deployment.degraded`) while they do not all serve its generation, `ready` again (webhook
  `deployment.recovered`) once they do (`app.deployments.health`); a deployment that lost a member
  heals by its `on_engine_loss` setting (`app.runner.selfheal`), which also finds an engine whose
  process is gone before its heartbeat timeout (first in the pass).
- `desired-size`: a deployment's standing autoscaler intents (deferred for an active job or the
  cooldown, held by the stabilization rule, paused) become a job once nothing holds them back, each at
  most once; intents nobody repeated for `intent_ttl_s` expire (`app.scale.desired`).
- `retention`: records that only grow (inbound hook records, finished webhook deliveries and the
  outbox events no delivery needs, Idempotency-Key records) pruned by age (`app.retention.prune_all`,
  settings `EPCTL_RETENTION_*`).

A task that fails is logged and tried again at its next interval; it never stops the loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session, select

from app.agents.errors import AgentCallError
from app.agents.fleet import Fleet
from app.core.clock import utc_now
from app.core.config import Settings
from app.deployments.health import HealthChange, reconcile_health
from app.engines.models import Engine, EnginePublic, EngineState
from app.engines.service import mark_unreachable
from app.jobs.models import CleanupState, ReconfigurationJob
from app.jobs.transitions import append_event
from app.launchers.base import Launcher
from app.retention import prune_all
from app.runner.record import JobRecord
from app.runner.selfheal import confirm_losses, heal
from app.runner.settings import RunnerSettings
from app.runner.stalls import fence_stalled
from app.scale import desired
from app.webhooks.models import EventType
from engine_agent.protocol import CleanupRecord, CleanupStatus

log = logging.getLogger(__name__)

UNSETTLED = (CleanupState.pending.value, CleanupState.running.value)


@dataclass
class Periodic:
    """One task and how often it runs."""

    name: str
    interval_s: float
    run: Callable[[], Awaitable[Any]]
    last_run: float = field(default=float("-inf"))

    def due(self, now: float) -> bool:
        return now - self.last_run >= self.interval_s


class Scheduled:
    def __init__(self, tasks: Sequence[Periodic]) -> None:
        self.tasks = list(tasks)

    async def tick(self) -> None:
        """Run every task that is due, one after another."""
        for task in self.tasks:
            now = time.monotonic()
            if not task.due(now):
                continue
            task.last_run = now
            try:
                await task.run()
            except Exception:
                log.exception("scheduled task %s failed", task.name)


def scheduled_tasks(
    record: JobRecord,
    settings: RunnerSettings,
    new_fleet: Callable[[], Fleet],
    heartbeat_timeout_s: float,
    retention: Retention | None = None,
    launchers: Mapping[str, Launcher] | None = None,
) -> list[Periodic]:
    """The runner's periodic tasks."""
    started = utc_now()
    suspects: dict[str, float] = {}

    def health(session: Session) -> None:
        health_pass(session, suspects, settings.health_confirm_s)

    async def heartbeats() -> None:
        # An engine marked lost and its deployment's reason go in one transaction (`follow`).
        await confirm_losses(record, follow=health)  # a dead engine found before its heartbeat timeout
        await record.run_in_session(fence_stalled)  # a frozen one, on its peers' evidence
        await expire_heartbeats(record, heartbeat_timeout_s, watching_since=started, follow=health)
        await follow_health(record, suspects, settings.health_confirm_s)
        if launchers is not None:
            await heal(record, launchers, fence_grace_s=heartbeat_timeout_s)

    return [
        Periodic(
            "cleanup", settings.cleanup_poll_interval_s, lambda: poll_cleanup_outcomes(record, new_fleet)
        ),
        Periodic("heartbeats", settings.heartbeat_check_interval_s, heartbeats),
        Periodic(
            "desired-size",
            settings.desired_size_interval_s,
            lambda: reconcile_desired_sizes(record, ttl_s=settings.intent_ttl_s),
        ),
        *([retention.task(record)] if retention is not None else []),
    ]


async def reconcile_desired_sizes(record: JobRecord, *, ttl_s: float = 86400.0) -> list[str]:
    """Start the jobs standing intents ask for; the ids of those started."""
    return await record.run_in_session(
        lambda session: [job.id for job in desired.reconcile(session, ttl_s=ttl_s)]
    )


@dataclass(frozen=True)
class Retention:
    """How old a record may grow before `app.retention.prune_all` deletes it, and how often to look."""

    settings: Settings
    interval_s: float

    def task(self, record: JobRecord) -> Periodic:
        async def prune() -> None:
            pruned = await record.run_in_session(lambda session: prune_all(session, self.settings))
            if any(pruned.values()):
                log.info("retention pruned %s", pruned)

        return Periodic("retention", self.interval_s, prune)


# --- heartbeats ---------------------------------------------------------------------------------------


async def expire_heartbeats(
    record: JobRecord,
    timeout_s: float,
    *,
    watching_since: datetime | None = None,
    follow: Callable[[Session], object] | None = None,
) -> list[EnginePublic]:
    """Mark engines silent for longer than `timeout_s` unreachable (and their deployment degraded);
    `follow` (the health pass) in the same transaction, when one was marked.

    Silence counts from `watching_since` at the earliest (when this coordinator started): agents
    could not reach a coordinator that was down, so each gets one full timeout to be heard from."""
    silent_since = utc_now() - timedelta(seconds=timeout_s)
    if watching_since is not None and silent_since <= watching_since:
        return []
    expired = await record.run_in_session(
        lambda s: mark_unreachable(s, silent_since=silent_since, follow=follow)
    )
    for engine in expired:
        log.warning(
            "engine %s of %s: no heartbeat since %s; marked unreachable",
            engine.id,
            engine.deployment,
            engine.last_heartbeat_at,
        )
    return expired


async def follow_health(
    record: JobRecord, suspects: dict[str, float], confirm_s: float
) -> list[HealthChange]:
    """Each deployment's status from its engines' heartbeats (`app.deployments.health`)."""
    return await record.run_in_session(lambda s: health_pass(s, suspects, confirm_s))


def health_pass(session: Session, suspects: dict[str, float], confirm_s: float) -> list[HealthChange]:
    """`reconcile_health`, its changes logged; in the caller's session (it commits)."""
    changes = reconcile_health(session, suspects=suspects, confirm_s=confirm_s)
    for change in changes:
        if change.detail is None:
            log.warning("deployment %s recovered: every member serves its generation", change.deployment)
        else:
            log.warning("deployment %s degraded: %s", change.deployment, change.detail.message)
    return changes


# --- cleanup outcomes ---------------------------------------------------------------------------------


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


async def poll_cleanup_outcomes(record: JobRecord, new_fleet: Callable[[], Fleet]) -> None:
    """One pass over every job whose cleanup is unsettled."""
    pending = await record.run_in_session(_unsettled_jobs)
    if not pending:
        return
    async with new_fleet() as fleet:
        for job, engines in pending:
            await _poll_one(record, fleet, job, engines)


async def _poll_one(
    record: JobRecord, fleet: Fleet, job: ReconfigurationJob, engines: Sequence[Engine]
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
