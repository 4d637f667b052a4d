"""The jobs' history, bounded by policy (`EPCTL_RETENTION_JOBS_S`, off by default: history is kept).

A finished job (succeeded, rolled back, failed, cancelled) that last changed before the cut-off is
deleted with its event log, oldest first, in batches of one transaction each (a pass never holds the
database for the whole history). Never deleted: an active job, and the newest `KEEP_NEWEST` jobs of each
deployment, whatever their age (self-healing counts its attempts in a row, and an incident names the
job it hit, from the newest jobs: `app.backends.reference.liveness.observe.NEWEST_JOBS`).
Incidents and webhook events that name a deleted job keep the id; the job's URL answers 404.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.jobs.models import JobEvent, ReconfigurationJob
from app.jobs.states import TERMINAL_STATES

KEEP_NEWEST = 3
BATCH = 5000


@dataclass(frozen=True)
class Pruned:
    """What one pass removed: jobs, their events, and the newest `updated_at` among the jobs."""

    jobs: int = 0
    events: int = 0
    newest: datetime | None = None


def prunable(candidates: Sequence[tuple[str, str]], newest_of: dict[str, set[str]]) -> list[str]:
    """The candidates (id, deployment id) that are not among their deployment's newest jobs."""
    return [job_id for job_id, deployment in candidates if job_id not in newest_of.get(deployment, set())]


def prune_finished_jobs(
    session: Session, *, older_than: datetime, batch: int = BATCH, keep_newest: int = KEEP_NEWEST
) -> Pruned:
    """Delete finished jobs last changed before `older_than`, with their events (see the module)."""
    jobs = events = 0
    newest: datetime | None = None
    after = ""
    terminal = [s.value for s in TERMINAL_STATES]
    while True:
        rows = session.exec(
            select(ReconfigurationJob.id, ReconfigurationJob.deployment_id, ReconfigurationJob.updated_at)
            .where(
                col(ReconfigurationJob.id) > after,
                col(ReconfigurationJob.state).in_(terminal),
                col(ReconfigurationJob.updated_at) < older_than,
            )
            .order_by(col(ReconfigurationJob.id))
            .limit(batch)
        ).all()
        if not rows:
            break
        after = rows[-1][0]
        kept = _newest(session, {deployment for _, deployment, _ in rows}, keep_newest)
        ids = prunable([(job_id, deployment) for job_id, deployment, _ in rows], kept)
        if ids:
            events += _deleted(session.execute(sa.delete(JobEvent).where(col(JobEvent.job_id).in_(ids))))
            jobs += _deleted(
                session.execute(sa.delete(ReconfigurationJob).where(col(ReconfigurationJob.id).in_(ids)))
            )
            session.commit()
            chosen = set(ids)
            last = max(updated for job_id, _, updated in rows if job_id in chosen)
            newest = last if newest is None else max(newest, last)
        if len(rows) < batch:
            break
    return Pruned(jobs=jobs, events=events, newest=newest)


def _newest(session: Session, deployments: set[str], keep: int) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for deployment in deployments:  # one indexed query each (deployment_id, created_at)
        found[deployment] = set(
            session.exec(
                select(ReconfigurationJob.id)
                .where(ReconfigurationJob.deployment_id == deployment)
                .order_by(col(ReconfigurationJob.created_at).desc())
                .limit(keep)
            ).all()
        )
    return found


def _deleted(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)
