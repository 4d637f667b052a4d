"""Heartbeat shedding: past saturation a coordinator answers heartbeats at once instead of late (issue 37).

A heartbeat's answer is sent once its row is committed. When heartbeats arrive faster than the coordinator
records them, requests queue at the admission gate (`app.core.limits`), every answer comes later, and past
an agent's wait (10 s) nobody reads it: the coordinator spends its core on heartbeats nobody waits for, and
the liveness pass marks heartbeating engines lost (2,048 engines on 2 cores: 2,019 shown lost). Instead:

- `shed`: a heartbeat that arrives while the gate's queue is older than `after_s` is answered at once,
  503 with `Retry-After` (`retry_after_s`), without parsing, routing or touching the database;
- the coordinator remembers that it heard the engine (`ShedHeartbeats`, in memory): a shed heartbeat is
  proof of life as good as a recorded one for the silence rule (`heard_at`), so an engine is never
  written off for the coordinator's own overload. Only a heartbeat whose token this coordinator has seen
  valid (its authentication cache) counts: a stranger's request cannot keep a dead engine alive;
- the agent waits `Retry-After` (at least its interval) before the next heartbeat: the offered rate
  falls to what the coordinator records, instead of growing with retries.

The record of a shed heartbeat is this coordinator's alone: another coordinator on the same database
judges from the rows (a liveness pass runs on each coordinator that runs jobs); see
docs/operations/scalability.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from prometheus_client import Counter

from app.metrics import REGISTRY

HEARTBEAT_PATH = re.compile(r"^/v1/engines/([^/]+)/heartbeat$")

SHED = Counter(
    "epctl_heartbeats_shed",
    "Heartbeats answered 503 with Retry-After at once because the coordinator was saturated.",
    registry=REGISTRY,
)


def heartbeat_engine(method: str, path: str) -> str | None:
    """The engine id of a heartbeat request (`POST /v1/engines/{id}/heartbeat`), else None."""
    if method != "POST":
        return None
    found = HEARTBEAT_PATH.match(path)
    return found.group(1) if found else None


def bearer_secret(scope: Mapping[str, Any]) -> str | None:
    """The secret of an ASGI request's `Authorization: Bearer <secret>` header, else None."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, secret = value.decode("latin-1").partition(" ")
            return secret.strip() or None if scheme.lower() == "bearer" else None
    return None


def shed(waiting: int, queue_age_s: float, after_s: float) -> bool:
    """Whether to answer a heartbeat at once (503): requests wait at the gate and the queue is older than
    `after_s` (what a heartbeat admitted now would wait, about). `after_s` <= 0 turns shedding off."""
    return after_s > 0 and waiting > 0 and queue_age_s > after_s


def shed_now(waiting: int, queue_age_s: float, backlog_age_s: float, after_s: float) -> bool:
    """`shed`, or the heartbeats already admitted wait longer than `after_s` for their commit
    (`backlog_age_s`: they leave the gate once queued for their batch, so the gate alone no longer shows
    a coordinator that falls behind)."""
    return shed(waiting, queue_age_s, after_s) or (after_s > 0 and backlog_age_s > after_s)


def retry_after_s(heartbeat_timeout_s: float) -> int:
    """How long a shed agent waits before its next heartbeat: a third of the heartbeat timeout (at least
    1 s), so two more heartbeats (shed or recorded) still fall inside the timeout."""
    return max(1, int(heartbeat_timeout_s // 3))


def heard_at(last_heartbeat_at: datetime | None, shed_at: datetime | None) -> datetime | None:
    """When the coordinator last heard the engine: its recorded heartbeat or a shed one, the later."""
    if last_heartbeat_at is None or shed_at is None:
        return last_heartbeat_at or shed_at
    if last_heartbeat_at.tzinfo is None and shed_at.tzinfo is not None:
        last_heartbeat_at = last_heartbeat_at.replace(tzinfo=shed_at.tzinfo)  # SQLite's naive UTC
    return max(last_heartbeat_at, shed_at)


class ShedHeartbeats:
    """Engine id -> when its last shed heartbeat came (this process's memory; bounded by the engines
    that heartbeat, pruned by the liveness pass)."""

    def __init__(self) -> None:
        self._heard: dict[str, datetime] = {}

    def record(self, engine_id: str, at: datetime) -> None:
        self._heard[engine_id] = at

    def snapshot(self) -> dict[str, datetime]:
        return dict(self._heard)

    def newest(self) -> datetime | None:
        return max(self._heard.values(), default=None)

    def prune(self, before: datetime) -> None:
        """Forget shed heartbeats older than `before` (past the heartbeat timeout they prove nothing)."""
        for engine_id in [e for e, at in self._heard.items() if at < before]:
            del self._heard[engine_id]


SHED_HEARTBEATS = ShedHeartbeats()  # the process's (one coordinator per process)
