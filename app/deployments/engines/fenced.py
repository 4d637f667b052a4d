"""A fenced engine that thaws on a group its peers left (issue 39).

The coordinator fences a frozen member and tells the others to leave its group before the serving
deadline; their abandoned collective still runs in gloo's threads until it times out, so a member that
thaws meanwhile can complete its last collective against it and report serving the old generation for a
while (until its next collective finds nobody). Its record stays fenced, off any rank, until it reports
something else (idle, having left that generation): no stale generation is ever recorded as serving, so
the deployment never reads a generation split, and the grow-back re-admits it once idle.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.deployments.engines.models import SERVING_STATES, Engine
from app.deployments.models import Deployment
from engine_agent.protocol import AgentHeartbeat


def left_behind_by(session: Session, engine: Engine, heartbeat: AgentHeartbeat) -> bool:
    """Whether the fenced `engine`'s heartbeat reports a group that is gone (see `stays_fenced`)."""
    generation = heartbeat.generation
    return stays_fenced(
        heartbeat.state.value,
        generation,
        _deployment_generation(session, engine.deployment_id),
        _reported_broken(session, engine, generation),
    )


def stays_fenced(state: str, generation: int, deployment_generation: int, broken_elsewhere: bool) -> bool:
    """A fenced engine that reports serving (or paused on) `generation` stays fenced when that group is
    gone: the deployment moved past it, or another member reports it broken (pure)."""
    if state not in SERVING_STATES or generation <= 0:
        return False
    return deployment_generation > generation or broken_elsewhere


def _deployment_generation(session: Session, deployment_id: str) -> int:
    deployment = session.get(Deployment, deployment_id)
    return deployment.generation if deployment is not None else 0


def _reported_broken(session: Session, engine: Engine, generation: int) -> bool:
    if generation <= 0:
        return False
    found = session.exec(
        select(sa.func.count())
        .select_from(Engine)
        .where(
            col(Engine.deployment_id) == engine.deployment_id,
            col(Engine.id) != engine.id,
            col(Engine.broken_generation) == generation,
        )
    ).one()
    return bool(found)
