"""Engines stuck in a serving collective, as their heartbeats say (issue 39).

An agent whose serving collective has waited past its slow mark (`engine_agent.groups.SLOW_AFTER_S`, far
above a step) says so in a heartbeat sent at once: the generation, how long it has waited, and which
other members did not answer the health probe it made meanwhile (`stuck_*`). The liveness pass reads
these to fence a frozen member on evidence (`app.backends.reference.liveness.engines.frozen_member`)
well before the serving deadline would break the group.

The reports are this coordinator's memory, not the record's: they are true for a second or two, and a
heartbeat without them (the collective completed, or the group broke) clears them. Another coordinator
on the same database does not see them; it judges a freeze at the serving deadline, as before.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

# Two reports of one wait give starts this close (heartbeat latencies differ): the first one's is kept.
SAME_WAIT_S = 0.25


@dataclass(frozen=True)
class Stuck:
    """One engine's report: it has waited on a serving collective of `generation` since `since` (this
    coordinator's clock: the heartbeat's arrival minus how long it said it had waited)."""

    generation: int
    since: datetime
    unanswered: tuple[str, ...] = ()  # members that did not answer its probe, made during this wait
    reported_at: datetime | None = None


class StuckReports:
    """Engine id -> its latest stuck report (this process's memory, pruned by the liveness pass)."""

    def __init__(self) -> None:
        self._reports: dict[str, Stuck] = {}
        self._lock = threading.Lock()

    def note(
        self,
        engine_id: str,
        generation: int | None,
        stuck_ms: float | None,
        unanswered: list[str],
        now: datetime,
    ) -> bool:
        """Take one heartbeat's `stuck_*` fields (none: the engine is not stuck, its report is dropped).
        True when it is news the liveness pass should judge now: a new wait, or new names."""
        with self._lock:
            old = self._reports.get(engine_id)
            if generation is None or stuck_ms is None:
                self._reports.pop(engine_id, None)
                return False
            since = now - timedelta(milliseconds=stuck_ms)
            same = (
                old is not None
                and old.generation == generation
                and abs((since - old.since).total_seconds()) < SAME_WAIT_S
            )
            if same and old is not None:
                since = min(since, old.since)
            names = tuple(sorted(unanswered))
            self._reports[engine_id] = Stuck(generation, since, names, now)
            return not same or old is None or old.unanswered != names

    def snapshot(self) -> dict[str, Stuck]:
        with self._lock:
            return dict(self._reports)

    def prune(self, before: datetime) -> None:
        """Forget reports not renewed since `before` (an engine that went silent while stuck)."""
        with self._lock:
            for engine_id in [k for k, v in self._reports.items() if (v.reported_at or v.since) < before]:
                del self._reports[engine_id]


STUCK = StuckReports()
