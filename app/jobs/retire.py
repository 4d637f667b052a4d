"""Operator-chosen leavers: `retire: [engine ids]` on a scale-down request.

Checked when the job is created, so a bad list is a 422 problem and nothing is written. The runner
checks membership again when it plans (an engine may have left in between)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlmodel import Session, select

from app.core.errors import InvalidRequestError
from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment, EngineBackend

# An engine in one of these states, on the deployment's generation with a rank, serves it.
SERVING_STATES = frozenset(
    {EngineState.serving.value, EngineState.paused.value, EngineState.unreachable.value}
)


def current_members(session: Session, deployment: Deployment) -> list[Engine]:
    """The engines of the deployment's current generation, in rank order."""
    rows = session.exec(
        select(Engine).where(
            Engine.deployment_id == deployment.id, Engine.generation == deployment.generation
        )
    ).all()
    members = [r for r in rows if r.dp_rank is not None and r.state in SERVING_STATES]
    return sorted(members, key=lambda r: r.dp_rank if r.dp_rank is not None else -1)


def validate_retire(session: Session, deployment: Deployment, target: int, retire: Sequence[str]) -> None:
    """Raise a 422 naming the first problem: retire on a scale-up (or at the same size), a backend
    that cannot choose its leavers, duplicates, engines that are not members, everyone, or a count that
    is not the shrink."""
    current = deployment.current_dp_size
    if target >= current:
        raise InvalidRequestError(
            f"retire names engines to leave, but {deployment.name!r} grows (or stays) from {current} to "
            f"{target}: retire goes with a scale-down only",
            code="retire-on-scale-up",
            current_dp_size=current,
        )
    if deployment.backend != EngineBackend.reference:
        raise InvalidRequestError(
            f"deployment {deployment.name!r} fronts a {deployment.backend} engine, which picks its own "
            "leavers: retire is not supported there",
            code="retire-not-supported",
        )
    repeated = sorted(engine for engine, n in Counter(retire).items() if n > 1)
    if repeated:
        raise InvalidRequestError(
            f"retire names engines more than once: {repeated}", code="retire-duplicates", engines=repeated
        )
    members = [row.id for row in current_members(session, deployment)]
    strangers = [engine for engine in retire if engine not in members]
    if strangers:
        raise InvalidRequestError(
            f"retire names engines that do not serve {deployment.name!r} now: {strangers} "
            f"(members: {members})",
            code="retire-not-member",
            engines=strangers,
        )
    if len(retire) >= len(members):
        raise InvalidRequestError(
            f"retire names every engine of {deployment.name!r}: at least one must stay",
            code="retire-everyone",
        )
    if len(retire) != current - target:
        raise InvalidRequestError(
            f"scaling {deployment.name!r} from {current} to {target} retires {current - target} "
            f"engine(s), retire names {len(retire)}",
            code="retire-count-mismatch",
            expected=current - target,
        )
