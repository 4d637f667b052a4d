"""Liveness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine_agent.routes.deps import AgentDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(agent: AgentDep) -> dict[str, str]:
    return {"status": "ok", "state": str(agent.engine.state)}


@router.get("/metrics", response_class=Response)
def metrics(agent: AgentDep) -> Response:
    return Response(generate_latest(agent.metrics.registry), media_type=CONTENT_TYPE_LATEST)
