"""Deployment CRUD, HTTP-free (the API, the CLI, the runner and tests call these)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import ConflictError, InvalidRequestError, NotFoundError
from app.core.ids import new_id
from app.deployments.models import Deployment, DeploymentCreate, DeploymentUpdate
from app.engines.models import Engine
from app.jobs.models import JobEvent, ReconfigurationJob
from app.jobs.states import ACTIVE_STATES

DEPLOYMENT_ID_PREFIX = "dep"


class DeploymentNotFoundError(NotFoundError):
    code = "deployment-not-found"


def create_deployment(session: Session, *, data: DeploymentCreate) -> Deployment:
    deployment = Deployment(
        id=new_id(DEPLOYMENT_ID_PREFIX),
        name=data.name,
        engine_config=data.engine.model_dump(mode="json"),
        min_dp_size=data.min_dp_size,
        max_dp_size=data.max_dp_size,
        warmup_policy=data.warmup_policy.value,
        strategy=data.strategy.value,
        launcher=data.launcher.value,
        autoscale_cooldown_s=data.autoscale_cooldown_s,
    )
    session.add(deployment)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise ConflictError(
            f"a deployment named {data.name!r} already exists", code="deployment-exists", name=data.name
        ) from None
    return deployment


def list_deployments(session: Session) -> list[Deployment]:
    return list(session.exec(select(Deployment).order_by(col(Deployment.name))).all())


def get_deployment(session: Session, *, ref: str) -> Deployment:
    """By name (what users type) or by id."""
    deployment = session.exec(select(Deployment).where(Deployment.name == ref)).first()
    if deployment is None:
        deployment = session.get(Deployment, ref)
    if deployment is None:
        raise DeploymentNotFoundError(f"no deployment named {ref!r}", deployment=ref)
    return deployment


def active_job_id(session: Session, *, deployment_id: str) -> str | None:
    return session.exec(
        select(ReconfigurationJob.id).where(
            ReconfigurationJob.deployment_id == deployment_id,
            col(ReconfigurationJob.state).in_([s.value for s in ACTIVE_STATES]),
        )
    ).first()


def update_deployment(session: Session, *, ref: str, data: DeploymentUpdate) -> Deployment:
    deployment = get_deployment(session, ref=ref)
    changes = data.model_dump(exclude_unset=True, exclude_none=True, mode="json")
    min_dp = changes.get("min_dp_size", deployment.min_dp_size)
    max_dp = changes.get("max_dp_size", deployment.max_dp_size)
    if min_dp > max_dp:
        raise InvalidRequestError(
            f"min_dp_size ({min_dp}) would exceed max_dp_size ({max_dp})", code="invalid-limits"
        )
    for field, value in changes.items():
        setattr(deployment, field, value)
    deployment.updated_at = utc_now()
    session.add(deployment)
    session.commit()
    return deployment


def delete_deployment(session: Session, *, ref: str) -> None:
    """Only when idle (no active job). Removes its engines and its job history with it."""
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
    session.execute(sa.delete(Engine).where(col(Engine.deployment_id) == deployment.id))
    session.delete(deployment)
    try:
        session.commit()
    except IntegrityError:  # a job was created between our check and the delete
        session.rollback()
        raise ConflictError(
            f"deployment {deployment.name!r} became busy while deleting", code="deployment-busy"
        ) from None
