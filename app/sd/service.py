"""Prometheus HTTP service discovery (`http_sd_configs`) for the agents' metrics. HTTP-free.

Agents listen on ports the launcher picks, so a static scrape config cannot name them. The coordinator
knows every registered engine: this lists the serving ones (and paused ones: a commit window is
exactly when their metrics matter) as one target group each, in the shape Prometheus reads:
`[{"targets": ["host:port"], "labels": {...}}]`. Engines that left or stopped answering are not listed,
so Prometheus drops their targets at its next refresh.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment

LISTED_STATES = (EngineState.serving.value, EngineState.paused.value)


class TargetGroup(BaseModel):
    targets: list[str] = Field(description="host:port of the agent")
    labels: dict[str, str] = Field(
        description="__scheme__, __metrics_path__, and deployment, engine_id, dp_rank, platform, device"
    )


def agent_targets(session: Session, *, deployment: str | None = None) -> list[TargetGroup]:
    """One target group per serving (or paused) engine, ordered by deployment and rank."""
    query = (
        select(Engine, Deployment.name)
        .join(Deployment, col(Deployment.id) == col(Engine.deployment_id))
        .where(col(Engine.state).in_(LISTED_STATES))
        .order_by(col(Deployment.name), col(Engine.dp_rank), col(Engine.id))
    )
    if deployment is not None:
        query = query.where(col(Deployment.name) == deployment)
    groups = []
    for engine, name in session.exec(query).all():
        parts = urlsplit(engine.url)
        if not parts.hostname:
            continue
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        base = parts.path.rstrip("/")
        groups.append(
            TargetGroup(
                targets=[f"{host}:{port}"],
                labels={
                    "__scheme__": parts.scheme or "http",
                    "__metrics_path__": f"{base}/metrics",
                    "deployment": name,
                    "engine_id": engine.id,
                    "dp_rank": "" if engine.dp_rank is None else str(engine.dp_rank),
                    "platform": engine.platform,
                    "device": engine.device,
                },
            )
        )
    return groups
