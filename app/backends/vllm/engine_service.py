"""A vLLM deployment's server, seen and handled by an operator: observe it, reconcile the record
with it, (re)start it with the local launcher. HTTP-free (the router and tests call these).

Reconciling: vLLM's per-engine metric labels tell its DP size exactly at start and after a scale-up
(see `discovery.py`). When the labels match the size the record expects them to show, the record is
right (it keeps a lower size after a scale-down); when they differ, the server was restarted or
scaled outside epctl and its labelled size is adopted. An operator may also state the size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic import Field as ApiField
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.backends.vllm.client import VllmClient
from app.backends.vllm.discovery import Observation, observe
from app.backends.vllm.launcher import ServeSpec, VllmLauncher, VllmLaunchError
from app.backends.vllm.record import Degradation, restart_hint, set_degraded, set_serving
from app.core.errors import ConflictError, InvalidRequestError, UnavailableError
from app.core.sealing import opened
from app.deployments.models import Deployment, DeploymentStatus, EngineBackend, LauncherKind, StatusDetail
from app.deployments.service import get_deployment
from app.jobs.service import active_job_id

T = TypeVar("T")


class EngineView(BaseModel):
    """A vLLM deployment's server as it answers now, beside the record."""

    deployment: str
    url: str | None
    launcher: LauncherKind
    reachable: bool
    healthy: bool
    scaling: bool | None = ApiField(description="vLLM's own flag (or its 503 'currently scaling')")
    health_status: int | None
    metrics_engines: int | None = ApiField(
        description="distinct `engine` labels on vLLM's metrics: its DP size at start and after a scale-up"
    )
    expected_metrics_engines: int | None = ApiField(description="what the record expects them to show")
    current_dp_size: int
    generation: int
    consistent: bool | None = ApiField(
        description="metrics and record agree; null when the metrics cannot tell"
    )
    status: DeploymentStatus
    status_detail: StatusDetail | None
    error: str | None
    notes: list[str]
    server_pid: int | None = ApiField(None, description="local launcher: the server's process id")
    server_log: str | None = ApiField(None, description="local launcher: the server's log file")


class ReconcileRequest(BaseModel):
    dp_size: int | None = ApiField(
        None, ge=1, le=1024, description="state the server's DP size (when its metrics cannot tell)"
    )


class VllmDeploymentError(ConflictError):
    code = "backend-mismatch"


class EngineLaunchFailedError(UnavailableError):
    code = "engine-launch-failed"


async def _db(db: DbEngine, work: Callable[[Session], T]) -> T:
    def inner() -> T:
        with Session(db, expire_on_commit=False) as session:
            return work(session)

    return await asyncio.to_thread(inner)


def _vllm_deployment(session: Session, name: str) -> Deployment:
    deployment = get_deployment(session, ref=name)
    if deployment.backend != EngineBackend.vllm:
        raise VllmDeploymentError(
            f"deployment {deployment.name!r} runs backend {deployment.backend}, not vllm",
            deployment=deployment.name,
        )
    return deployment


def _view(deployment: Deployment, seen: Observation | None, launcher: VllmLauncher | None) -> EngineView:
    config = deployment.backend_config or {}
    expected = config.get("metrics_dp_size")
    engines = seen.metrics_engines if seen else None
    handle = (
        launcher.handle(deployment.name) if launcher and deployment.launcher == LauncherKind.local else None
    )
    return EngineView(
        deployment=deployment.name,
        url=config.get("url"),
        launcher=LauncherKind(deployment.launcher),
        reachable=bool(seen and seen.reachable),
        healthy=bool(seen and seen.healthy),
        scaling=seen.scaling if seen else None,
        health_status=seen.health_status if seen else None,
        metrics_engines=engines,
        expected_metrics_engines=expected,
        current_dp_size=deployment.current_dp_size,
        generation=deployment.generation,
        consistent=None if engines is None or expected is None else engines == expected,
        status=DeploymentStatus(deployment.status),
        status_detail=StatusDetail.model_validate(deployment.status_detail)
        if deployment.status_detail
        else None,
        error=seen.error if seen else "not started",
        notes=list(seen.notes) if seen else [],
        server_pid=handle.pid if handle else None,
        server_log=str(handle.log_path) if handle else None,
    )


async def _observe(deployment: Deployment, timeout_s: float) -> Observation | None:
    config = deployment.backend_config or {}
    url = config.get("url")
    if not url:
        return None
    async with VllmClient(url, api_key=opened(deployment.backend_secret), timeout_s=timeout_s) as client:
        return await observe(client)


async def engine_view(
    db: DbEngine, name: str, *, launcher: VllmLauncher | None = None, timeout_s: float = 5.0
) -> EngineView:
    """The server as it answers now; writes nothing."""
    deployment = await _db(db, lambda s: _vllm_deployment(s, name))
    return _view(deployment, await _observe(deployment, timeout_s), launcher)


def _apply(
    session: Session, deployment_id: str, seen: Observation | None, stated: int | None, *, fresh: bool
) -> Deployment:
    """Write what the observation says into the record (in one transaction)."""
    deployment = session.get(Deployment, deployment_id, populate_existing=True)
    assert deployment is not None
    hint = restart_hint(deployment.name, deployment.launcher)
    if seen is None or not seen.reachable:
        error = seen.error if seen else "never started"
        set_degraded(
            session,
            deployment.id,
            Degradation("engine-unreachable", f"vLLM is unreachable: {error}", hint),
            None,
        )
    elif seen.scaling:
        set_degraded(
            session, deployment.id, Degradation("engine-stuck-scaling", "vLLM says it is scaling", hint), None
        )
    elif not seen.healthy:
        set_degraded(
            session,
            deployment.id,
            Degradation("engine-unhealthy", f"vLLM's /health answered {seen.health_status}", hint),
            None,
        )
    else:
        expected = (deployment.backend_config or {}).get("metrics_dp_size")
        engines = seen.metrics_engines
        if stated is not None:
            set_serving(session, deployment.id, dp_size=stated, metrics_dp_size=engines)
        elif engines is not None and (fresh or expected is None or engines != expected):
            set_serving(session, deployment.id, dp_size=engines, metrics_dp_size=engines)
        elif engines is None and deployment.current_dp_size == 0:
            set_degraded(
                session,
                deployment.id,
                Degradation(
                    "dp-size-unknown",
                    "vLLM's metrics carry no per-engine label: its DP size is unknown",
                    f'POST /v1/deployments/{deployment.name}/engine/reconcile with {{"dp_size": N}}',
                ),
                None,
            )
        else:
            set_serving(session, deployment.id)
    session.commit()
    session.refresh(deployment)
    return deployment


def _check_idle(session: Session, deployment: Deployment) -> None:
    active = active_job_id(session, deployment_id=deployment.id)
    if active is not None:
        raise ConflictError(
            f"deployment {deployment.name!r} has an active reconfiguration {active}; wait for it to end",
            code="deployment-busy",
            active_job_id=active,
        )


async def reconcile_engine(
    db: DbEngine,
    name: str,
    *,
    dp_size: int | None = None,
    launcher: VllmLauncher | None = None,
    timeout_s: float = 5.0,
) -> EngineView:
    """Observe the server and bring the record in line: ready when it serves (adopting its size where
    it differs), degraded with the reason when it does not."""

    def idle(session: Session) -> Deployment:
        deployment = _vllm_deployment(session, name)
        _check_idle(session, deployment)
        return deployment

    deployment = await _db(db, idle)
    seen = await _observe(deployment, timeout_s)
    deployment = await _db(db, lambda s: _apply(s, deployment.id, seen, dp_size, fresh=False))
    return _view(deployment, seen, launcher)


async def restart_engine(
    db: DbEngine, name: str, *, launcher: VllmLauncher, timeout_s: float = 5.0
) -> EngineView:
    """Stop the deployment's local server (if any) and start it again; then reconcile."""

    def idle(session: Session) -> Deployment:
        deployment = _vllm_deployment(session, name)
        if deployment.launcher != LauncherKind.local:
            raise InvalidRequestError(
                f"deployment {deployment.name!r} uses launcher {deployment.launcher}: epctl does not run its "
                "vLLM server; restart it where it runs, then POST .../engine/reconcile",
                code="not-locally-launched",
            )
        _check_idle(session, deployment)
        return deployment

    deployment = await _db(db, idle)
    config: dict[str, Any] = deployment.backend_config or {}
    spec = ServeSpec(
        deployment=deployment.name,
        model=str(config.get("model")),
        api_key=opened(deployment.backend_secret),
        served_model_name=config.get("served_model_name"),
        serve_args=tuple(config.get("serve_args") or ()),
        cpu_defaults=bool(config.get("cpu_defaults", True)),
    )
    try:
        handle = await launcher.restart(spec)
    except VllmLaunchError as exc:
        failed = Degradation(
            "engine-launch-failed", exc.message, f"see {exc.log_path}" if exc.log_path else None
        )

        def degrade(session: Session) -> None:
            set_degraded(session, deployment.id, failed, None)
            session.commit()

        await _db(db, degrade)
        raise EngineLaunchFailedError(
            f"the vLLM server of {deployment.name!r} did not start: {exc.message}"
        ) from exc

    def record_url(session: Session) -> Deployment:
        set_serving(session, deployment.id, url=handle.url)
        session.commit()
        row = session.get(Deployment, deployment.id, populate_existing=True)
        assert row is not None
        return row

    deployment = await _db(db, record_url)
    seen = await _observe(deployment, timeout_s)
    deployment = await _db(db, lambda s: _apply(s, deployment.id, seen, None, fresh=True))
    return _view(deployment, seen, launcher)


async def observe_new_deployment(db: DbEngine, name: str, *, timeout_s: float = 5.0) -> None:
    """Right after creation: the server's size becomes the record's (or the deployment is degraded,
    saying why). A local deployment's server is not started yet: nothing to observe."""
    deployment = await _db(db, lambda s: _vllm_deployment(s, name))
    if not (deployment.backend_config or {}).get("url"):
        return
    seen = await _observe(deployment, timeout_s)
    await _db(db, lambda s: _apply(s, deployment.id, seen, None, fresh=True))
