"""A member that stalled, fenced on evidence instead of at its heartbeat timeout.

When an EP group breaks on a serving deadline, its live members leave it and each reports, in its next
heartbeats, the generation that broke and which other members did not answer its health probe
(`engine_agent.peer_check`). A member is fenced here when every other member of the generation reported
the break and named it, and it has not been heard from since the first report: a frozen engine (its
serving loop and HTTP server both stopped) is then out of the generation within about a second of the
serving deadline, not 10 s later at the heartbeat timeout.

Fenced is not dead: the engine is not stopped. Self-healing re-forms the generation on the survivors
(it is written off the generation like a lost engine, `app.runner.selfheal`), and if it comes back
(heartbeats again, idle) within the heartbeat timeout, the grow-back re-admits it; otherwise it is
written off for good and stopped then. A thawed engine can never serve the fenced generation: every
other member left its group, and generations are never reused (`app.backends.reference.fencing`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlmodel import Session

from app.core.clock import utc_now
from app.deployments.engines.models import Engine
from app.deployments.health import SERVING_STATES, deployments_without_a_job
from app.deployments.models import Deployment, DeploymentStatus, StatusDetail
from app.deployments.status import set_status
from app.runner.selfheal import fence

log = logging.getLogger(__name__)

REASON_STALLED = "engine-stalled"


@dataclass(frozen=True)
class Stall:
    deployment: str
    engine_id: str
    generation: int
    named_by: tuple[str, ...]


def stalled_members(deployment: Deployment, engines: Sequence[Engine]) -> list[tuple[Engine, list[str]]]:
    """The members of the deployment's generation that every other member named when its group broke,
    and that were not heard from since (see the module doc), each with who named it."""
    generation = deployment.generation
    reporters = [e for e in engines if e.broken_generation == generation and e.broken_reported_at]
    if not reporters:
        return []
    still_on = [
        e
        for e in engines
        if e.generation == generation and e.state in SERVING_STATES and e.broken_generation != generation
    ]
    if len(reporters) + len(still_on) < deployment.current_dp_size:
        return []  # not every member spoke yet (or some left otherwise): no verdict
    first_report = min(e.broken_reported_at for e in reporters if e.broken_reported_at is not None)
    found = []
    for engine in still_on:
        others = [e for e in reporters if e.id != engine.id]
        named = others and all(engine.id in (e.unresponsive_peers or []) for e in others)
        silent = engine.last_heartbeat_at is None or engine.last_heartbeat_at < first_report
        if named and silent:
            found.append((engine, [e.id for e in others]))
    return found


def fence_stalled(session: Session) -> list[Stall]:
    """Fence every stalled member (see the module doc) of the deployments no job runs; commits."""
    stalls: list[Stall] = []
    for deployment, engines in deployments_without_a_job(session):
        found = stalled_members(deployment, engines)
        if not found:
            continue
        names = ", ".join(engine.id for engine, _ in found)
        message = (
            f"{names} stopped answering: every other member of generation {deployment.generation} named "
            f"it when the group broke at the serving deadline; fenced, the generation re-forms without it"
        )
        fence(session, deployment, [engine for engine, _ in found], why="stalled: named by every survivor")
        detail = StatusDetail(
            reason=REASON_STALLED,
            message=message,
            hint="a frozen engine that comes back within the heartbeat timeout is re-admitted; one that "
            "does not is written off and stopped",
            since=utc_now(),
        )
        set_status(session, deployment, DeploymentStatus.degraded, detail, serving=0)
        session.commit()
        log.warning("deployment %s: %s", deployment.name, message)
        stalls += [
            Stall(deployment.name, engine.id, deployment.generation, tuple(named)) for engine, named in found
        ]
    return stalls
