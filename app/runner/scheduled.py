"""Periodic work the runner's loop ticks, each task at its own interval (beside the backends' own,
`Backend.periodic`, e.g. following the reference engines' background cleanup):

- `heartbeats`: engines silent for longer than `EPCTL_HEARTBEAT_TIMEOUT_S` (counted from this
  coordinator's start at the earliest) become `unreachable`, a deployment that loses a member
  `degraded`, each announced as `engine.unreachable`
  (`app.deployments.engines.service.mark_unreachable`); then
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlmodel import Session

from app.backends.base import Periodic
from app.core.clock import utc_now
from app.core.config import Settings
from app.core.runner_settings import RunnerSettings
from app.deployments.engines.models import EnginePublic
from app.deployments.engines.service import hear_nobody, mark_unreachable
from app.deployments.health import HealthChange, reconcile_health
from app.jobs.async_record import WorkerSessions
from app.jobs.models import CleanupState
from app.launchers.base import Launcher
from app.retention import prune_all
from app.runner.selfheal import confirm_losses, heal
from app.runner.stalls import fence_stalled
from app.scale import desired

log = logging.getLogger(__name__)

UNSETTLED = (CleanupState.pending.value, CleanupState.running.value)


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
    record: WorkerSessions,
    settings: RunnerSettings,
    heartbeat_timeout_s: float,
    retention: Retention | None = None,
    launchers: Mapping[str, Launcher] | None = None,
) -> list[Periodic]:
    """The runner's periodic tasks."""
    started = utc_now()
    suspects: dict[str, float] = {}

    def health(session: Session) -> None:
        health_pass(session, suspects, settings.health_confirm_s)

    hearing = Hearing()

    async def heartbeats() -> None:
        # An engine marked lost and its deployment's reason go in one transaction (`follow`).
        await confirm_losses(record, follow=health)  # a dead engine found before its heartbeat timeout
        await record.run_in_session(fence_stalled)  # a frozen one, on its peers' evidence
        await expire_heartbeats(
            record, heartbeat_timeout_s, watching_since=started, follow=health, hearing=hearing
        )
        await follow_health(record, suspects, settings.health_confirm_s)
        if launchers is not None:
            await heal(record, launchers, fence_grace_s=heartbeat_timeout_s)

    return [
        Periodic("heartbeats", settings.heartbeat_check_interval_s, heartbeats),
        Periodic(
            "desired-size",
            settings.desired_size_interval_s,
            lambda: reconcile_desired_sizes(record, ttl_s=settings.intent_ttl_s),
        ),
        *([retention.task(record)] if retention is not None else []),
    ]


async def reconcile_desired_sizes(record: WorkerSessions, *, ttl_s: float = 86400.0) -> list[str]:
    """Start the jobs standing intents ask for; the ids of those started."""
    return await record.run_in_session(
        lambda session: [job.id for job in desired.reconcile(session, ttl_s=ttl_s)]
    )


@dataclass(frozen=True)
class Retention:
    """How old a record may grow before `app.retention.prune_all` deletes it, and how often to look."""

    settings: Settings
    interval_s: float

    def task(self, record: WorkerSessions) -> Periodic:
        async def prune() -> None:
            pruned = await record.run_in_session(lambda session: prune_all(session, self.settings))
            if any(pruned.values()):
                log.info("retention pruned %s", pruned)

        return Periodic("retention", self.interval_s, prune)


# --- heartbeats ---------------------------------------------------------------------------------------


@dataclass
class Hearing:
    """When this coordinator last heard no engine at all (`app.deployments.engines.service.hear_nobody`)."""

    deaf_at: datetime | None = None


async def expire_heartbeats(
    record: WorkerSessions,
    timeout_s: float,
    *,
    watching_since: datetime | None = None,
    follow: Callable[[Session], object] | None = None,
    hearing: Hearing | None = None,
) -> list[EnginePublic]:
    """Mark engines silent for longer than `timeout_s` unreachable (and their deployment degraded);
    `follow` (the health pass) in the same transaction, when one was marked.

    Silence counts from `watching_since` at the earliest (when this coordinator started): agents
    could not reach a coordinator that was down, so each gets one full timeout to be heard from.

    `hearing`: a coordinator that hears no engine at all has lost its own network (issue 24): nothing is
    marked (every silent member is a lost link instead), and once it hears again each engine gets one
    full timeout from then, as after a restart, since their heartbeats come back one by one."""
    now = utc_now()
    silent_since = now - timedelta(seconds=timeout_s)
    if watching_since is not None and silent_since <= watching_since:
        return []
    if hearing is not None:
        if await record.run_in_session(lambda s: hear_nobody(s, silent_since=silent_since)):
            hearing.deaf_at = now
        if hearing.deaf_at is not None and silent_since <= hearing.deaf_at:
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
    record: WorkerSessions, suspects: dict[str, float], confirm_s: float
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
