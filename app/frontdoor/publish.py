"""A job's front-door step: write the feed's next version now (the record just changed) and wait, up
to a deadline, until the deployment's front door applied it. Without a front door there is nothing to
wait for (other routers follow the feed at their own pace)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlmodel import Session

from app.deployments.models import Deployment
from app.frontdoor import service
from app.frontdoor.keeper import KEEPERS
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

    def message(self) -> str:
        listed = (
            ", ".join(f"{engine} {state}" for engine, state in sorted(self.states.items())) or "no engine"
        )
        if not self.front_door:
            return f"{self.what}: feed version {self.resource_version} ({listed}); no front door to wait for"
        if self.applied:
            return (
                f"{self.what}: front door applied version {self.resource_version} in "
                f"{self.took_ms:.1f} ms ({listed})"
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
            "states": self.states,
        }


async def publish(
    in_session: InSession[Any],
    deployment_id: str,
    what: str,
    deadline_s: float = DEADLINE_S,
    before: Callable[[Session], None] | None = None,
) -> DoorStep:
    """`before`: a change of the record to make first, in the same session (e.g. the job's results
    saying it ends on the old generation)."""
    started = time.monotonic()

    def write(session: Session) -> tuple[int, dict[str, str], bool]:
        if before is not None:
            before(session)
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None
        version, _ = service.refresh(session, deployment)
        states = {str(e["engine_id"]): str(e["state"]) for e in version.endpoints}
        return version.resource_version, states, service.front_door_of(session, deployment_id) is not None

    version, states, has_door = await in_session(write)
    if not has_door:
        return DoorStep(what, version, False, False, (time.monotonic() - started) * 1000.0, states)

    def applied(session: Session) -> bool:
        door = service.front_door_of(session, deployment_id)
        return door is None or (door.applied_version or 0) >= version

    while True:
        keeper = KEEPERS.get(deployment_id)  # kept by this process: its memory answers at once
        if keeper is not None and keeper.applied is not None and keeper.applied >= version:
            return DoorStep(what, version, True, True, (time.monotonic() - started) * 1000.0, states)
        if keeper is None and await in_session(applied):
            return DoorStep(what, version, True, True, (time.monotonic() - started) * 1000.0, states)
        left = deadline_s - (time.monotonic() - started)
        if left <= 0:
            return DoorStep(what, version, True, False, (time.monotonic() - started) * 1000.0, states)
        await FEED_APPLIED.wait(min(left, POLL_S))
