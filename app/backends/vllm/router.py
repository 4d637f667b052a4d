"""`/v1/deployments/{name}/engine`: a vLLM deployment's server, live, and the operator's remedies."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request
from sqlalchemy.engine import Engine as DbEngine

from app.api.deps import EngineAgent, Reader, get_db_engine
from app.backends.vllm import engine_service
from app.backends.vllm.engine_service import EngineView, ReconcileRequest
from app.backends.vllm.launcher import VllmLauncher
from app.core.problems import problem_responses

router = APIRouter(
    prefix="/v1/deployments/{name}/engine", tags=["deployments"], responses=problem_responses(401, 403, 422)
)
DbDep = Annotated[DbEngine, Depends(get_db_engine)]


def _launcher(request: Request) -> VllmLauncher | None:
    return getattr(request.app.state, "vllm_launcher", None)


def _timeout(request: Request) -> float:
    settings = getattr(request.app.state, "vllm_settings", None)
    return settings.call_timeout_s if settings is not None else 5.0


@router.get("", name="engine-get", responses=problem_responses(404, 409))
async def get_engine(name: str, request: Request, db: DbDep, _: Reader) -> EngineView:
    """A vLLM deployment's server as it answers now (health, scaling, the DP size its metrics show)
    beside the record. Writes nothing."""
    return await engine_service.engine_view(
        db, name, launcher=_launcher(request), timeout_s=_timeout(request)
    )


@router.post("/reconcile", name="engine-reconcile", responses=problem_responses(404, 409))
async def reconcile_engine(
    name: str,
    request: Request,
    db: DbDep,
    _: EngineAgent,
    body: Annotated[ReconcileRequest | None, Body()] = None,
) -> EngineView:
    """Observe the server and bring the record in line: `ready` when it serves (adopting the DP size
    its metrics show where that differs, or `dp_size` when given), `degraded` with the reason when it
    does not. For after a restart made outside epctl. Operator role; refused while a job is active."""
    return await engine_service.reconcile_engine(
        db,
        name,
        dp_size=body.dp_size if body else None,
        launcher=_launcher(request),
        timeout_s=_timeout(request),
    )


@router.post("/restart", name="engine-restart", responses=problem_responses(404, 409, 503))
async def restart_engine(name: str, request: Request, db: DbDep, _: EngineAgent) -> EngineView:
    """Launcher `local` only: stop the deployment's vLLM server (if it runs) and start it again, then
    reconcile. Answers once the server is ready (a health check and a completion), or 503. The remedy
    for a server that is stuck scaling or refuses every scale. Operator role; refused while a job is
    active."""
    launcher = _launcher(request)
    if launcher is None:
        from app.core.errors import UnavailableError

        raise UnavailableError("this coordinator runs no local vLLM launcher", code="no-vllm-launcher")
    return await engine_service.restart_engine(db, name, launcher=launcher, timeout_s=_timeout(request))
