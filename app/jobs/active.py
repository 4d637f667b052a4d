"""Which job a deployment runs now: the one query every writer of a deployment's record asks first (a
deployment a job runs is that job's to judge). Below the job service, so the engine and deployment
records can ask it without importing the service."""

from __future__ import annotations

from sqlmodel import Session, col, select

from app.jobs.models import ReconfigurationJob
from app.jobs.states import ACTIVE_STATES


def active_job_id(session: Session, *, deployment_id: str) -> str | None:
    """The deployment's one non-terminal job, if any."""
    return session.exec(
        select(ReconfigurationJob.id).where(
            ReconfigurationJob.deployment_id == deployment_id,
            col(ReconfigurationJob.state).in_([s.value for s in ACTIVE_STATES]),
        )
    ).first()
