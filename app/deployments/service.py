"""Deployment CRUD, HTTP-free (the API, the CLI, the runner and tests call these).

Deployments know nothing of jobs: a deployment's active job and its deletion with its job history are
`app.jobs` (`active.active_job_id`, `deletion.delete_deployment`)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import ConflictError, InvalidRequestError, NotFoundError
from app.core.ids import new_id
from app.core.sealing import seal
from app.deployments.agent_keys import give_new_key
from app.deployments.autoscaling import ScalingBehavior
from app.deployments.engines.models import Engine, EngineState
from app.deployments.front_door import FrontDoor
from app.deployments.models import (
    Deployment,
    DeploymentCreate,
    DeploymentStatus,
    DeploymentUpdate,
    EngineBackend,
    LauncherKind,
    ray_settings_of,
    spares_problem,
)

DEPLOYMENT_ID_PREFIX = "dep"


class DeploymentNotFoundError(NotFoundError):
    code = "deployment-not-found"


def create_deployment(session: Session, *, data: DeploymentCreate) -> Deployment:
    """A vLLM deployment starts with DP size 0 (unknown) until its server is observed (the router does
    that right after); one that the local launcher runs is degraded until its server is started."""
    vllm = data.vllm if data.backend is EngineBackend.vllm else None
    status, detail = DeploymentStatus.ready.value, None
    if vllm is not None and not vllm.url:
        status = DeploymentStatus.degraded.value
        detail = {
            "reason": "engine-not-started",
            "message": "the local launcher has not started this deployment's vLLM server yet",
            "hint": f"POST /v1/deployments/{data.name}/engine/restart "
            f"(`epctl deployments restart-engine {data.name}`)",
            "since": utc_now().isoformat(),
            "job_id": None,
        }
    deployment = Deployment(
        id=new_id(DEPLOYMENT_ID_PREFIX),
        name=data.name,
        engine_config=data.engine.model_dump(mode="json"),
        min_dp_size=data.min_dp_size,
        max_dp_size=data.max_dp_size,
        warmup_policy=data.warmup_policy.value,
        strategy=data.strategy.value,
        launcher=data.launcher.value,
        launcher_options=data.launcher_options(),
        autoscale_cooldown_s=data.autoscale_cooldown_s,
        on_engine_loss=data.on_engine_loss.value if data.on_engine_loss else None,
        max_downtime_ms=data.max_downtime_ms,
        spares=data.spares,
        launch_timeout_s=data.launch_timeout_s,
        autoscale_behavior=data.autoscale_behavior.model_dump(mode="json"),
        autoscale_paused=data.autoscale_paused,
        backend=data.backend.value,
        backend_config=vllm.stored() if vllm else None,
        backend_secret=seal(vllm.api_key.get_secret_value()) if vllm and vllm.api_key else None,
        status=status,
        status_detail=detail,
    )
    give_new_key(deployment, data.agent_key.get_secret_value() if data.agent_key else None)
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


def update_deployment(
    session: Session, *, ref: str, data: DeploymentUpdate, active_job_id: str | None = None
) -> Deployment:
    """Only the fields given change. `active_job_id`: the deployment's active job, if any (the caller
    knows jobs; a Ray cluster or namespace does not move under one)."""
    deployment = get_deployment(session, ref=ref)
    changes = data.model_dump(
        exclude_unset=True, exclude_none=True, mode="json", exclude={"vllm", "ray", "autoscale_behavior"}
    )
    if data.autoscale_behavior is not None:
        behavior = ScalingBehavior.stored(deployment.autoscale_behavior).merged(data.autoscale_behavior)
        deployment.autoscale_behavior = behavior.model_dump(mode="json")
    if data.vllm is not None:
        _update_vllm(deployment, data)
    if data.ray is not None:
        _check_ray_update(session, deployment, data, active_job_id)
        deployment.launcher_options = data.ray.model_dump(mode="json")
    min_dp = changes.get("min_dp_size", deployment.min_dp_size)
    max_dp = changes.get("max_dp_size", deployment.max_dp_size)
    if min_dp > max_dp:
        raise InvalidRequestError(
            f"min_dp_size ({min_dp}) would exceed max_dp_size ({max_dp})", code="invalid-limits"
        )
    if changes.get("spares"):
        problem = spares_problem(deployment.backend, deployment.launcher)
        if problem:
            raise InvalidRequestError(f"deployment {deployment.name!r}: {problem}", code="spares-unsupported")
    for field, value in changes.items():
        setattr(deployment, field, value)
    if "max_downtime_ms" in data.model_fields_set:  # null is a value here: no budget
        deployment.max_downtime_ms = data.max_downtime_ms
    if "launch_timeout_s" in data.model_fields_set:  # null is a value here: adaptive
        deployment.launch_timeout_s = data.launch_timeout_s
    deployment.updated_at = utc_now()
    session.add(deployment)
    session.commit()
    return deployment


def _check_ray_update(
    session: Session, deployment: Deployment, data: DeploymentUpdate, active_job_id: str | None
) -> None:
    """New Ray settings apply to the next launch; moving the actors' cluster or namespace would lose
    the engines already running there (or being launched by the active job), so that waits until
    there are none."""
    assert data.ray is not None
    if deployment.launcher != LauncherKind.ray.value:
        raise InvalidRequestError(
            f"deployment {deployment.name!r} uses launcher {deployment.launcher}; "
            "`ray` settings apply to launcher ray only",
            code="launcher-mismatch",
        )
    current = ray_settings_of(deployment)
    assert current is not None
    moves = current.address != data.ray.address or current.namespace != data.ray.namespace
    if not moves:
        return
    engines = session.exec(
        select(Engine.id).where(Engine.deployment_id == deployment.id, Engine.state != EngineState.left.value)
    ).all()
    if engines or active_job_id is not None:
        raise ConflictError(
            f"deployment {deployment.name!r} still has {len(engines)} engine(s) on its Ray cluster; "
            "its engines must be gone before the Ray address or namespace can change",
            code="ray-engines-running",
            engines=list(engines),
        )


def delete_deployment_rows(session: Session, deployment: Deployment) -> None:
    """Delete the deployment and its engines, and commit. The caller removes what refers to it first
    (its job history: `app.jobs.deletion.delete_deployment`, which also refuses while a job is active).
    Raises `IntegrityError` if something still refers to it."""
    session.execute(sa.delete(Engine).where(col(Engine.deployment_id) == deployment.id))
    # Its front door and its rank-set feed's versions (`app.frontdoor`, above this floor: by table name).
    session.execute(sa.delete(FrontDoor).where(col(FrontDoor.deployment_id) == deployment.id))
    session.execute(
        sa.text("DELETE FROM endpoint_set_versions WHERE deployment_id = :id"), {"id": deployment.id}
    )
    session.delete(deployment)
    session.commit()


def _update_vllm(deployment: Deployment, data: DeploymentUpdate) -> None:
    assert data.vllm is not None
    if deployment.backend != EngineBackend.vllm:
        raise InvalidRequestError(
            f"deployment {deployment.name!r} runs backend {deployment.backend}: `vllm` settings do not apply",
            code="backend-mismatch",
        )
    given = data.vllm.model_dump(exclude_unset=True, exclude={"api_key"}, mode="json")
    if deployment.launcher == LauncherKind.local and "url" in given:
        raise InvalidRequestError(
            "the local launcher sets the url of the server it starts", code="url-set-by-launcher"
        )
    if "api_key" in data.vllm.model_fields_set:
        key = data.vllm.api_key.get_secret_value() if data.vllm.api_key else ""
        deployment.backend_secret = seal(key) if key else None
    deployment.backend_config = {**(deployment.backend_config or {}), **given}
