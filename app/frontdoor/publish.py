"""A job's front-door step: write the feed's next version now (the record just changed) and wait, up
to a deadline, until the deployment's front door applied it. Without a front door there is nothing to
wait for (other routers follow the feed at their own pace)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sqlmodel import Session

from app.deployments.models import Deployment
from app.frontdoor import service
from app.frontdoor.keeper import KEEPERS
from app.frontdoor.models import EndpointPublic, EndpointSetPublic
from app.frontdoor.wakeup import FEED_APPLIED

T = TypeVar("T")
InSession = Callable[[Callable[[Session], T]], Awaitable[T]]

DEADLINE_S = 3.0
POLL_S = 0.02


@dataclass(frozen=True)
class DoorStep:
    what: str
    resource_version: int
    front_door: bool  # the deployment has one
    applied: bool  # it applied this version (or a later one) within the deadline
    took_ms: float
    states: dict[str, str]  # engine id -> state at this version
    started_at: float = 0.0  # epoch seconds, when the step began
    # From the step's start to HAProxy serving this version's rank set: given ahead of the write
    # (`serve_ahead`) when the version says what was given, else when the front door applied it.
    in_service_ms: float | None = None

    def message(self) -> str:
        listed = (
            ", ".join(f"{engine} {state}" for engine, state in sorted(self.states.items())) or "no engine"
        )
        if not self.front_door:
            return f"{self.what}: feed version {self.resource_version} ({listed}); no front door to wait for"
        if self.applied:
            ahead = (
                f", serving its rank set from {self.in_service_ms:.1f} ms"
                if self.in_service_ms is not None and self.in_service_ms < self.took_ms
                else ""
            )
            return (
                f"{self.what}: front door applied version {self.resource_version} in "
                f"{self.took_ms:.1f} ms{ahead} ({listed})"
            )
        return (
            f"{self.what}: front door did not apply version {self.resource_version} within "
            f"{self.took_ms:.0f} ms ({listed}); going on"
        )

    def data(self) -> dict[str, Any]:
        return {
            "front_door_step": self.what,
            "resource_version": self.resource_version,
            "applied": self.applied if self.front_door else None,
            "took_ms": round(self.took_ms, 3),
            "started_at": round(self.started_at, 6),
            "in_service_ms": None if self.in_service_ms is None else round(self.in_service_ms, 3),
            "states": self.states,
        }


@dataclass(frozen=True)
class Written:
    """A version written (or found current) by a front-door step, not yet known applied."""

    resource_version: int
    states: dict[str, str]
    front_door: bool
    started: float  # monotonic, when the step began
    started_at: float  # epoch seconds, the same moment
    feed: EndpointSetPublic | None = None  # the version as the feed serves it, for a keeper here
    served_at: float | None = None  # monotonic: HAProxy served this version's set before it was written


@dataclass(frozen=True)
class Ahead:
    """A rank set given to the front door before the version saying it was written."""

    served_at: float  # monotonic, when HAProxy answered
    endpoints: list[EndpointPublic]
    started: float  # monotonic, when the step began
    started_at: float  # epoch seconds, the same moment


async def serve_ahead(
    in_session: InSession[Any],
    deployment_id: str,
    job: tuple[str, str],
    engine_results: list[dict[str, Any]],
    derived: list[EndpointPublic] | None = None,
) -> Ahead | None:
    """The rank set job `job` (id, state) will make the feed say once its results are
    `engine_results`, given to this process's keeper of the deployment's front door now (reads only;
    `service.derive_switched`, `keeper.serve_ahead`); None where no keeper here is in step with
    HAProxy, or the job moved on. `derived`: that set, derived already (before the commit window)."""
    started, started_at = time.monotonic(), time.time()
    if KEEPERS.get(deployment_id) is None:
        return None

    def derive(session: Session) -> list[EndpointPublic] | None:
        return service.derive_switched(session, deployment_id, *job, engine_results)

    endpoints = derived if derived is not None else await in_session(derive)
    keeper = KEEPERS.get(deployment_id)
    served_at = None if keeper is None or endpoints is None else await keeper.serve_ahead(endpoints)
    return None if served_at is None else Ahead(served_at, endpoints, started, started_at)


async def write(
    in_session: InSession[Any],
    deployment_id: str,
    before: Callable[[Session], None] | None = None,
    ahead: Ahead | None = None,
) -> Written:
    """The feed's version as the record says now (written first where it changed). `before`: a change
    of the record to make first, in the same session (e.g. the job's results saying it ends on the old
    generation). `ahead`: the set the front door was given before (the step began then)."""
    started, started_at = (ahead.started, ahead.started_at) if ahead else (time.monotonic(), time.time())

    def written(session: Session) -> Written:
        if before is not None:
            before(session)
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None
        version, _ = service.refresh(session, deployment)
        states = {str(e["engine_id"]): str(e["state"]) for e in version.endpoints}
        has_door = service.front_door_of(session, deployment_id) is not None
        kept_here = has_door and deployment_id in KEEPERS
        feed = service.public(session, deployment, version) if kept_here else None
        return Written(version.resource_version, states, has_door, started, started_at, feed)

    try:
        done = await in_session(written)
    except BaseException:
        _resync(deployment_id, ahead)
        raise
    if ahead is not None and done.feed is not None and _same(ahead.endpoints, done.feed.endpoints):
        done = replace(done, served_at=ahead.served_at)
    elif ahead is not None:  # the record says otherwise (the job moved on meanwhile): as it says
        _resync(deployment_id, ahead)
    keeper = KEEPERS.get(deployment_id)
    if keeper is not None and done.feed is not None:
        await keeper.offer(deployment_id, done.feed)  # applied now, not at the keeper's next read
    return done


async def settle(
    in_session: InSession[Any],
    deployment_id: str,
    what: str,
    written: Written,
    deadline_s: float = DEADLINE_S,
) -> DoorStep:
    """Wait, up to `deadline_s` from the step's start, until the front door applied the version."""
    version, started = written.resource_version, written.started

    def step(applied: bool) -> DoorStep:
        took_ms = (time.monotonic() - started) * 1000.0
        served = written.served_at
        in_service = (served - started) * 1000.0 if served is not None else took_ms if applied else None
        door = written.front_door
        return DoorStep(what, version, door, applied, took_ms, written.states, written.started_at, in_service)

    if not written.front_door:
        return step(False)

    def applied(session: Session) -> bool:
        door = service.front_door_of(session, deployment_id)
        return door is None or (door.applied_version or 0) >= version

    while True:
        keeper = KEEPERS.get(deployment_id)  # kept by this process: its memory answers at once
        if keeper is not None and keeper.applied is not None and keeper.applied >= version:
            return step(True)
        if keeper is None and await in_session(applied):
            return step(True)
        left = deadline_s - (time.monotonic() - started)
        if left <= 0:
            return step(False)
        await FEED_APPLIED.wait(min(left, POLL_S))


async def publish(
    in_session: InSession[Any],
    deployment_id: str,
    what: str,
    deadline_s: float = DEADLINE_S,
    before: Callable[[Session], None] | None = None,
) -> DoorStep:
    """Write the feed's next version and wait until the front door applied it (`write`, `settle`)."""
    written = await write(in_session, deployment_id, before)
    return await settle(in_session, deployment_id, what, written, deadline_s)


def _same(given: list[EndpointPublic], written: list[EndpointPublic]) -> bool:
    return [e.model_dump() for e in given] == [e.model_dump() for e in written]


def _resync(deployment_id: str, ahead: Ahead | None) -> None:
    """A set given ahead that no version says: the keeper takes HAProxy over again from the feed."""
    keeper = KEEPERS.get(deployment_id)
    if ahead is not None and keeper is not None:
        keeper.in_sync = False
