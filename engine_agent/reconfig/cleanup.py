"""The one background worker that destroys retired communicator groups after a switch, and releases
retired step graphs (`step_graphs.StepGraphs`: their memory pool goes back to the device here, never
inside the commit window).

Its outcome is observable (`CleanupStatus`). A failure is announced once (the `on_failure`
callback, the failure metric) and kept as the state `failed` with its record: the status carries it
without raising, and the next prepare refuses, naming it, until `retry` (destroy again) or
`acknowledge` resolves it. A retry runs the same groups again, so its failure is a new record, not the
old one repeated.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from engine_agent.groups import CommGroup, destroy_group
from engine_agent.protocol import CleanupRecord, CleanupState, CleanupStatus

log = logging.getLogger(__name__)

RECENT_LIMIT = 10


class InjectedCleanupFailure(RuntimeError):
    pass


class Releasable(Protocol):
    """What holds device memory beyond a generation's groups (its step graphs)."""

    graph_bytes: int

    def release(self) -> None: ...


@dataclass
class RetiredGeneration:
    job_id: str
    generation: int
    groups: list[CommGroup] = field(default_factory=list)
    graphs: list[Releasable] = field(default_factory=list)


class CleanupWorker:
    def __init__(
        self,
        destroy: Callable[[CommGroup], None] = destroy_group,
        on_failure: Callable[[CleanupRecord], None] | None = None,
    ) -> None:
        self._destroy = destroy
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._queue: collections.deque[RetiredGeneration] = collections.deque()
        self._running: RetiredGeneration | None = None
        self._failed: tuple[RetiredGeneration, CleanupRecord] | None = None
        self._recent: collections.deque[CleanupRecord] = collections.deque(maxlen=RECENT_LIMIT)
        self._fail_next = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="cleanup-worker", daemon=True)
        self._thread.start()

    def submit(self, retired: RetiredGeneration) -> None:
        with self._cond:
            self._queue.append(retired)
            self._cond.notify_all()

    def fail_next(self) -> None:
        """Test-only: the next cleanup raises before destroying anything (so a retry really destroys)."""
        with self._cond:
            self._fail_next = True

    def status(self) -> CleanupStatus:
        with self._cond:
            pending = [r.generation for r in self._queue]
            if self._running is not None:
                pending.insert(0, self._running.generation)
            if self._failed is not None:
                state = CleanupState.failed
            elif pending:
                state = CleanupState.running
            else:
                state = CleanupState.idle
            return CleanupStatus(
                state=state,
                pending_generations=pending,
                failure=self._failed[1] if self._failed else None,
                recent=list(self._recent),
            )

    def unresolved_failure(self) -> CleanupRecord | None:
        with self._cond:
            return self._failed[1] if self._failed else None

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or running. False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._running is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def retry(self) -> bool:
        """Re-run the failed cleanup. False if there is no failure to retry."""
        with self._cond:
            if self._failed is None:
                return False
            retired, _ = self._failed
            self._failed = None
            self._queue.appendleft(retired)
            self._cond.notify_all()
            return True

    def acknowledge(self) -> CleanupRecord | None:
        """Accept the failure as it is (the operator handled it); the groups are dropped."""
        with self._cond:
            if self._failed is None:
                return None
            _, record = self._failed
            self._failed = None
            self._cond.notify_all()
            return record

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                retired = self._queue.popleft()
                self._running = retired
                inject = self._fail_next
                self._fail_next = False
            started = time.monotonic()
            error: str | None = None
            released = 0
            try:
                if inject:
                    raise InjectedCleanupFailure("injected cleanup failure (fault injection)")
                for group in retired.groups:
                    self._destroy(group)
                while retired.graphs:  # popped once released: a retry does not release them twice
                    graphs = retired.graphs[0]
                    graphs.release()
                    released += graphs.graph_bytes
                    retired.graphs.pop(0)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "cleanup of generation %s (job %s) failed: %s", retired.generation, retired.job_id, error
                )
            record = CleanupRecord(
                job_id=retired.job_id,
                generation=retired.generation,
                ok=error is None,
                error=error,
                duration_ms=(time.monotonic() - started) * 1000.0,
                finished_at=time.time(),
                graph_bytes_released=released,
            )
            with self._cond:
                self._running = None
                self._recent.appendleft(record)
                if error is not None:
                    self._failed = (retired, record)
                self._cond.notify_all()
            if error is not None and self._on_failure is not None:
                self._on_failure(record)
