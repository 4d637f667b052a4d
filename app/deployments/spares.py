"""Warm spares on the record (issue 38): which engines of a deployment are kept as spares now.

A spare is an engine launched for the deployment and registered, idle, that never served in one of
its generations (`generation` 0, no broken generation) and does not refuse the agent key; a deployment
with `spares: S` counts its S oldest such engines as its spares. The reference backend keeps them
(`app.backends.reference.spares`: launched, holding every expert); self-heal and grows take them first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence

from sqlmodel import Session, col, select

from app.deployments.engines.models import SERVING_STATES, Engine, EngineState
from app.deployments.models import Deployment

ROLE_MEMBER = "member"
ROLE_SPARE = "spare"
# Registered: launched, its first heartbeat not in yet (it will be idle).
SPARE_STATES = (EngineState.idle.value, EngineState.registered.value)


def can_be_spare(engine: Engine) -> bool:
    """Idle (or registered, about to be), never a member of a generation of its deployment, key accepted."""
    return (
        engine.state in SPARE_STATES
        and engine.generation == 0
        and engine.broken_generation is None
        and engine.key_refused_at is None
    )


def spares_among(engines: Sequence[Engine], wanted: int) -> list[Engine]:
    """The `wanted` oldest engines that can be spares (fewer where fewer can)."""
    if wanted < 1:
        return []
    ready = sorted((e for e in engines if can_be_spare(e)), key=lambda e: (e.created_at, e.id))
    return ready[:wanted]


def spare_ids(session: Session, deployments: Collection[Deployment]) -> dict[str, list[str]]:
    """deployment id -> its spares' engine ids, oldest first (one query; deployments keeping none
    are absent)."""
    wanted = {d.id: d.spares for d in deployments if d.spares > 0}
    if not wanted:
        return {}
    rows = session.exec(
        select(Engine).where(col(Engine.deployment_id).in_(list(wanted)), col(Engine.state).in_(SPARE_STATES))
    ).all()
    by_deployment: dict[str, list[Engine]] = defaultdict(list)
    for row in rows:
        by_deployment[row.deployment_id].append(row)
    return {d: [e.id for e in spares_among(by_deployment[d], n)] for d, n in wanted.items()}


def role_of(engine: Engine, spares: Collection[str]) -> str | None:
    """`member` (on a rank of a generation), `spare`, or None (idle, leaving, lost...)."""
    if engine.id in spares:
        return ROLE_SPARE
    if engine.dp_rank is not None and engine.state in SERVING_STATES:
        return ROLE_MEMBER
    return None
