"""Which job a deployment runs now: the one query every writer of a deployment's record asks first (a
deployment a job runs is that job's to judge). Below the job service, so the engine and deployment
records can ask it without importing the service."""

from __future__ import annotations

from collections.abc import Collection

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


def active_job_ids(session: Session, deployment_ids: Collection[str]) -> dict[str, str]:
    """Each of these deployments' one non-terminal job, by deployment id (one query for any number)."""
    if not deployment_ids:
        return {}
    rows = session.exec(
        select(ReconfigurationJob.deployment_id, ReconfigurationJob.id).where(
            col(ReconfigurationJob.deployment_id).in_(list(deployment_ids)),
            col(ReconfigurationJob.state).in_([s.value for s in ACTIVE_STATES]),
        )
    ).all()
    return {deployment_id: job_id for deployment_id, job_id in rows}
