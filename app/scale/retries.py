"""A move that failed or rolled back is not the end of an intent: it stands pending again and is tried
once more after a backoff (`app.scale.stabilize.backoff_s`), until it is reached, superseded, withdrawn or
resolved. HTTP-free; each failed attempt is a record (`retrying`) that names its job.

A cancelled job is an operator's decision and is not retried (its intent stays acted on; a new ask acts).
Neither is a deferred `/scale` write's job: like a `/scale` write that started its job at once, it is
the writer's to repeat (as an HPA does every period).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationJob
from app.jobs.states import JobState
from app.scale import intents
from app.scale.hooks.models import HookDecision
from app.scale.intents import ScaleIntentRow
from app.scale.notes import note
from app.scale.stabilize import backoff_s

RETRIED = (JobState.rolled_back.value, JobState.failed.value)


def retry_failed(session: Session, deployment: Deployment, now: datetime) -> list[ScaleIntentRow]:
    """Standing intents whose last job failed or rolled back, made pending again with their next try's
    time (`attempts` counts the failures), each with a record; the caller commits."""
    rows = session.exec(
        select(ScaleIntentRow, ReconfigurationJob)
        .join(ReconfigurationJob, col(ReconfigurationJob.id) == col(ScaleIntentRow.job_id))
        .where(
            col(ScaleIntentRow.deployment_id) == deployment.id,
            col(ScaleIntentRow.state).in_(intents.STANDING),
            col(ScaleIntentRow.source) != intents.SPEC_SOURCE,
            col(ReconfigurationJob.state).in_(RETRIED),
        )
    ).all()
    failed = []
    for intent, job in rows:
        ended = job.finished_at or now
        retry_at = max(ended, now) + timedelta(seconds=backoff_s(intent.attempts + 1))
        intents.mark_failed(intent, retry_at=retry_at)
        intent.job_id = None  # counted once; the record of the attempt keeps the job
        session.add(intent)
        note(
            session,
            deployment,
            intent,
            HookDecision.deferred,
            "retrying",
            f"the move to {job.to_dp_size} ended {job.state} (job {job.id}, attempt {intent.attempts}): "
            f"desired size {intent.target_dp_size} tried again from {retry_at.isoformat(timespec='seconds')}",
            job_id=job.id,
        )
        failed.append(intent)
    return failed
