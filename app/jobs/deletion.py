"""Deleting a deployment with its job history: only when idle (no active job), in one transaction."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.errors import ConflictError
from app.deployments.service import delete_deployment_rows, get_deployment
from app.jobs.active import active_job_id
from app.jobs.models import JobEvent, ReconfigurationJob


def delete_deployment(session: Session, *, ref: str) -> None:
    """Only when idle (no active job). Removes its job history, then its engines and itself."""
    deployment = get_deployment(session, ref=ref)
    active = active_job_id(session, deployment_id=deployment.id)
    if active is not None:
        raise ConflictError(
            f"deployment {deployment.name!r} has an active reconfiguration {active}; cancel it or wait",
            code="deployment-busy",
            active_job_id=active,
        )
    job_ids = select(ReconfigurationJob.id).where(ReconfigurationJob.deployment_id == deployment.id)
    session.execute(sa.delete(JobEvent).where(col(JobEvent.job_id).in_(job_ids)))
    session.execute(
        sa.delete(ReconfigurationJob).where(col(ReconfigurationJob.deployment_id) == deployment.id)
    )
    try:
        delete_deployment_rows(session, deployment)  # commits
    except IntegrityError:  # a job was created between our check and the delete
        session.rollback()
        raise ConflictError(
            f"deployment {deployment.name!r} became busy while deleting", code="deployment-busy"
        ) from None
