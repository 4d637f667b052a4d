"""Periodic work the runner's loop ticks, each task at its own interval (beside the backends' own,
`Backend.periodic`: the reference engines' liveness, their background cleanup, ...):

- `desired-size`: a deployment's standing autoscaler intents (deferred for an active job or the
  cooldown, held by the stabilization rule, paused) become a job once nothing holds them back, each at
  most once; intents nobody repeated for `intent_ttl_s` expire (`app.scale.desired`); a partial grow's
  standing target gets its completion job when due (`app.scale.standing`).
- `retention`: records that only grow (inbound hook records, finished webhook deliveries and the
  outbox events no delivery needs, Idempotency-Key records) pruned by age (`app.retention.prune_all`,
  settings `EPCTL_RETENTION_*`).

A task that fails is logged and tried again at its next interval; it never stops the loop. A task news woke
(`app.core.wake`: a heartbeat reporting a broken group wakes the liveness pass) runs at the next turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from app.backends.base import Periodic
from app.core.config import Settings
from app.core.runner_settings import RunnerSettings
from app.jobs.async_record import WorkerSessions
from app.retention import prune_all
from app.scale import desired, standing

log = logging.getLogger(__name__)


class Scheduled:
    def __init__(self, tasks: Sequence[Periodic]) -> None:
        self.tasks = list(tasks)

    async def tick(self, woken: Collection[str] = ()) -> None:
        """Run every task that is due, or that news woke (`app.core.wake`), one after another."""
        for task in self.tasks:
            now = time.monotonic()
            if not task.due(now) and task.name not in woken:
                continue
            task.last_run = now
            try:
                await task.run()
            except Exception:
                log.exception("scheduled task %s failed", task.name)


def scheduled_tasks(
    record: WorkerSessions, settings: RunnerSettings, retention: Retention | None = None
) -> list[Periodic]:
    """The runner's periodic tasks."""
    return [
        Periodic(
            "desired-size",
            settings.desired_size_interval_s,
            lambda: reconcile_desired_sizes(
                record, ttl_s=settings.intent_ttl_s, standing_retry_s=settings.standing_target_retry_s
            ),
        ),
        *([retention.task(record)] if retention is not None else []),
    ]


async def reconcile_desired_sizes(
    record: WorkerSessions, *, ttl_s: float = 86400.0, standing_retry_s: float = 30.0
) -> list[str]:
    """Start the jobs standing intents and standing targets ask for; the ids of those started."""
    return await record.run_in_session(
        lambda session: [
            job.id
            for job in [
                *desired.reconcile(session, ttl_s=ttl_s),
                *standing.complete(session, retry_s=standing_retry_s),
            ]
        ]
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
