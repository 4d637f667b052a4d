"""Which backend drives a job: the deployment's `backend` (the job runner picks the flow by it)."""

from __future__ import annotations

from sqlmodel import Session, select

from app.deployments.models import Deployment, EngineBackend
from app.jobs.models import ReconfigurationJob


def backend_of_job(session: Session, job_id: str) -> EngineBackend:
    backend = session.exec(
        select(Deployment.backend)
        .join(ReconfigurationJob, ReconfigurationJob.deployment_id == Deployment.id)  # type: ignore[arg-type]
        .where(ReconfigurationJob.id == job_id)
    ).first()
    return EngineBackend(backend or EngineBackend.reference.value)
