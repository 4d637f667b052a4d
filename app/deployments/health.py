"""A deployment's status from what its engines report, not from what the coordinator last wrote.

A deployment of size N at generation G is whole when exactly N of its engines report serving (or paused)
on G, on ranks 0..N-1, and none serves (or is paused on) another generation. Engines tell this in their
heartbeats (state, generation, rank); one that stops heartbeating is marked `unreachable`
(`app.deployments.engines.service.mark_unreachable`), one whose group broke reports itself idle on no
generation. So a dead, frozen or broken member shows here within a heartbeat timeout or one heartbeat.

`reconcile_health` (the runner's `heartbeats` task) compares that truth with the record while no job
runs the deployment (a job owns the status while it runs): whole and `degraded` -> `ready`, announced
as `deployment.recovered`; not whole and `ready` (or degraded without a reason yet) -> `degraded` with a
`status_detail`, announced as `deployment.degraded`. Each change is one transaction with its outbox
event (the metric is `epctl_deployment_status{status="degraded"}`, read at scrape time).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.deployments.engines.models import Engine, EngineState, refuses_key
from app.deployments.models import Deployment, DeploymentStatus, EngineBackend, StatusDetail
from app.deployments.status import set_status
from app.jobs.service import active_job_id

SERVING_STATES = frozenset({EngineState.serving.value, EngineState.paused.value})
REASON_UNREACHABLE = "engine-unreachable"
REASON_MEMBERS_MISSING = "members-missing"
REASON_GENERATION_SPLIT = "generation-split"
REASON_KEY_REFUSED = "engine-refuses-agent-key"
HEALTH_REASONS = frozenset(
    {REASON_UNREACHABLE, REASON_MEMBERS_MISSING, REASON_GENERATION_SPLIT, REASON_KEY_REFUSED}
)


@dataclass(frozen=True)
class Health:
    """What the engines say about one deployment."""

    whole: bool
    serving: int  # engines that serve the deployment's generation
    reason: str | None = None
    message: str = ""


@dataclass(frozen=True)
class HealthChange:
    deployment: str
    status: DeploymentStatus
    detail: StatusDetail | None


def assess(deployment: Deployment, engines: Sequence[Engine]) -> Health:
    """Whether the engines (the deployment's, not `left`) say the deployment is whole."""
    size, generation = deployment.current_dp_size, deployment.generation
    # An engine that refuses the coordinator's key serves, but no job can reach it: no member to count on.
    on_generation = [
        e for e in engines if e.generation == generation and e.state in SERVING_STATES and not refuses_key(e)
    ]
    ranks = sorted(e.dp_rank for e in on_generation if e.dp_rank is not None)
    # An engine serving another generation is a second group beside the deployment's (a switch that
    # failed part-way): the deployment is not whole even when its own generation is.
    strays = sorted(
        f"{e.id} (generation {e.generation})"
        for e in engines
        if e.generation != generation and e.state in SERVING_STATES
    )
    own_whole = len(on_generation) == size and ranks == list(range(size))
    if own_whole and not strays:
        return Health(whole=True, serving=size)
    unreachable = sorted(e.id for e in engines if e.state == EngineState.unreachable.value)
    left_group = sorted(
        e.id
        for e in engines
        if e.generation != generation and e.state == EngineState.idle.value and e.dp_rank is None
    )
    fenced = sorted(e.id for e in engines if e.state == EngineState.fenced.value)
    refusing = sorted(e.id for e in engines if refuses_key(e))
    parts = [f"{len(on_generation)} of {size} engines serve generation {generation}"]
    if unreachable:
        parts.append(f"unreachable: {', '.join(unreachable)}")
    if refusing:
        parts.append(f"refuse the coordinator's agent key: {', '.join(refusing)}")
    if fenced:
        parts.append(f"fenced (stalled): {', '.join(fenced)}")
    if len(on_generation) > size or len(set(ranks)) != len(ranks) or own_whole:
        # Two claims on one rank, or a whole generation with a second group beside it.
        reason = REASON_GENERATION_SPLIT
        parts.append(f"ranks reported: {ranks}")
    elif unreachable:
        reason = REASON_UNREACHABLE
    elif refusing:
        reason = REASON_KEY_REFUSED
    else:
        # A member missing is the reason even with a stray beside it: self-healing re-forms the
        # generation on what there is (a stray's fenced group ends at its first collective's deadline).
        reason = REASON_MEMBERS_MISSING
        if left_group:
            parts.append(f"on no generation: {', '.join(left_group)}")
    if strays:
        parts.append(f"serving another generation: {', '.join(strays)}")
    return Health(whole=False, serving=len(on_generation), reason=reason, message="; ".join(parts))


def deployments_without_a_job(session: Session) -> Iterator[tuple[Deployment, Sequence[Engine]]]:
    """Reference deployments with engines and no job running (a job's own steps judge the others),
    each with its engines that have not left."""
    deployments = session.exec(
        select(Deployment).where(
            col(Deployment.backend) == EngineBackend.reference.value, col(Deployment.current_dp_size) > 0
        )
    ).all()
    for deployment in deployments:
        if active_job_id(session, deployment_id=deployment.id) is not None:
            continue
        engines = session.exec(
            select(Engine).where(
                Engine.deployment_id == deployment.id, Engine.state != EngineState.left.value
            )
        ).all()
        yield deployment, engines


def reconcile_health(
    session: Session, *, suspects: dict[str, float] | None = None, confirm_s: float = 0.0
) -> list[HealthChange]:
    """Bring every reference deployment's status in line with its engines (see the module doc).

    `suspects` (deployment id -> when it was first seen broken, monotonic; kept by the caller between
    calls): a deployment is degraded only once it stayed broken for `confirm_s`, so a heartbeat sent
    just before a switch and received just after it cannot flap the status. An unreachable engine was
    confirmed by its heartbeat timeout already."""
    suspects = {} if suspects is None else suspects
    changes = []
    for deployment, engines in deployments_without_a_job(session):
        health = assess(deployment, engines)
        if health.whole:
            suspects.pop(deployment.id, None)
        elif health.reason != REASON_UNREACHABLE:
            first_seen = suspects.setdefault(deployment.id, time.monotonic())
            if time.monotonic() - first_seen < confirm_s:
                continue
        change = _apply(session, deployment, health)
        if change is not None:
            changes.append(change)
    session.commit()
    return changes


def _apply(session: Session, deployment: Deployment, health: Health) -> HealthChange | None:
    degraded = deployment.status == DeploymentStatus.degraded.value
    if health.whole:
        # A detail left on a ready deployment: a job (a self-heal) made it whole again since.
        change = set_status(session, deployment, DeploymentStatus.ready, serving=health.serving)
        return None if change is None else HealthChange(deployment.name, DeploymentStatus.ready, None)
    assert health.reason is not None
    if degraded and deployment.status_detail is not None:
        # Already degraded and announced. A detail health wrote itself is kept true as the engines
        # change ("1 of 3 engines serve" went on saying so after the last one stopped), without a
        # second event; a job's or self-healing's own reason is theirs to change.
        if deployment.status_detail.get("reason") in HEALTH_REASONS:
            set_status(
                session, deployment, DeploymentStatus.degraded, _detail(health), serving=health.serving
            )
        return None
    detail = _detail(health)
    set_status(session, deployment, DeploymentStatus.degraded, detail, serving=health.serving)
    return HealthChange(deployment.name, DeploymentStatus.degraded, detail)


def _detail(health: Health) -> StatusDetail:
    assert health.reason is not None
    return StatusDetail(
        reason=health.reason,
        message=health.message,
        hint="the deployment cannot serve until its group is whole: restart or replace the engines, "
        "or scale it to form a new generation on the engines that serve",
        since=utc_now(),
    )


def announce_degraded(session: Session, deployment: Deployment, detail: StatusDetail, serving: int) -> None:
    """Mark the deployment `degraded` for `detail` and announce it (`deployment.degraded`, even when it
    was degraded for another reason), in the session's transaction (the caller commits). For a reason
    health itself does not give, such as self-healing's `no-survivors`."""
    set_status(session, deployment, DeploymentStatus.degraded, detail, serving=serving, announce_again=True)
