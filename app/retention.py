"""Retention: records that only grow are pruned by age, on a schedule.

What is pruned, each by its owning service (settings `EPCTL_RETENTION_*`):
- inbound hook records (`hooks.service.prune_hook_requests`) older than `retention_hook_requests_s`, and
  scale intents that ended longer ago than that (`scale.intents.prune_ended`; standing ones are kept);
- finished webhook deliveries with their attempts, and the outbox events no delivery needs any more
  (`webhooks.service.prune_deliveries`) older than `retention_webhook_deliveries_s`;
- Idempotency-Key records (`jobs.service.prune_idempotency_records`) older than `retention_idempotency_s`;
- engines that left (`engines.service.prune_left_engines`), last changed before `retention_left_engines_s`.

- finished jobs with their event logs (`jobs.history.prune_finished_jobs`) last changed before
  `retention_jobs_s`, when set (0, the default: the history is kept); the newest jobs of each deployment
  and active ones never. The log line of the pass says how many and up to when.

The runner's scheduled
tasks (`app.runner.scheduled`) run `prune_all` every `retention_interval_s`; several coordinators may
prune at once (deletes by age are idempotent).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from prometheus_client import Counter
from sqlmodel import Session

from app.core.clock import utc_now
from app.core.config import Settings
from app.deployments.engines.service import prune_left_engines
from app.jobs.history import Pruned, prune_finished_jobs
from app.jobs.idempotency import prune_idempotency_records
from app.metrics import REGISTRY
from app.scale.hooks.service import prune_hook_requests
from app.scale.intents import prune_ended
from app.webhooks.service import prune_deliveries

log = logging.getLogger(__name__)
FIRST_PASS_DELAY_S = 5.0

PRUNED = Counter(
    "epctl_retention_pruned_rows", "Rows deleted by retention, by kind.", ["kind"], registry=REGISTRY
)


def prune_all(session: Session, settings: Settings) -> dict[str, int]:
    """One retention pass; returns rows deleted per kind."""
    now = utc_now()
    hooks = prune_hook_requests(
        session, older_than=now - timedelta(seconds=settings.retention_hook_requests_s)
    )
    ended_intents = prune_ended(
        session, older_than=now - timedelta(seconds=settings.retention_hook_requests_s)
    )
    deliveries, events = prune_deliveries(
        session, older_than=now - timedelta(seconds=settings.retention_webhook_deliveries_s)
    )
    keys = prune_idempotency_records(
        session, older_than=now - timedelta(seconds=settings.retention_idempotency_s)
    )
    engines = prune_left_engines(
        session, older_than=now - timedelta(seconds=settings.retention_left_engines_s)
    )
    history = (
        prune_finished_jobs(session, older_than=now - timedelta(seconds=settings.retention_jobs_s))
        if settings.retention_jobs_s > 0
        else Pruned()
    )
    if history.jobs:
        log.info(
            "retention: %d finished jobs (and %d events) deleted, the newest last changed %s; policy: "
            "older than %g s (EPCTL_RETENTION_JOBS_S)",
            history.jobs,
            history.events,
            history.newest.isoformat() if history.newest else "-",
            settings.retention_jobs_s,
        )
    pruned = {
        "hook_requests": hooks,
        "scale_intents": ended_intents,
        "webhook_deliveries": deliveries,
        "outbox_events": events,
        "idempotency_keys": keys,
        "left_engines": engines,
        "jobs": history.jobs,
        "job_events": history.events,
    }
    for kind, count in pruned.items():
        if count:
            PRUNED.labels(kind=kind).inc(count)
    return pruned
