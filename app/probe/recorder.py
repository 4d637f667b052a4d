"""Sends canaries at a steady rate to every serving target and keeps what came back.

    async with CanaryRecorder(canary, interval_s=0.1) as probe:
        probe.set_targets([url])
        probe.mark("before")          # phase boundaries, for per-phase figures
        ...
        probe.mark("committing")
        ...
    figures = probe.figures()

Every `interval_s` one canary goes to each target, whether or not earlier ones have answered (a
stalled target must show as a stall, not as a slower rate), up to `max_in_flight` per target; past
that a tick is counted as skipped. A canary that does not answer within `timeout_s` failed; one
answered after `deadline_s` (default: `timeout_s`) was late, and one still unanswered past its
deadline when the recorder stops is recorded as failed ("no answer when the probe stopped"). The
schedule does not catch up after a late tick (no bursts on a loaded machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

from app.probe.canary import Canary, CanaryResult, CanarySample
from app.probe.figures import ProbeFigures, probe_figures

log = logging.getLogger(__name__)

STOP_GRACE_S = 1.0  # how long stop() lets canaries in flight finish before dropping them
# A tick this late (in intervals, and at least STALL_MIN_S) is the recorder's own stall: its event loop
# or its process did not run, so answers that came meanwhile are read late.
STALL_INTERVALS = 5
STALL_MIN_S = 0.1


@dataclass(frozen=True)
class LiveView:
    """The probe right now, for progress: is the deployment answering, and since when not."""

    sent: int
    failed: int
    last_ok: bool | None  # None before the first answer
    failing_for_s: float | None  # since the first failure after the last success; None while serving
    last_status: int | None
    last_detail: str | None
    outage_seen: bool  # a failure happened at some point since the recorder started


class CanaryRecorder:
    def __init__(
        self,
        canary: Canary,
        *,
        interval_s: float = 0.1,
        timeout_s: float = 5.0,
        max_in_flight: int = 4,
        deadline_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.canary = canary
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        # A success later than this is counted late (it ends an outage all the same).
        self.deadline_s = min(deadline_s, timeout_s) if deadline_s is not None else timeout_s
        self._clock = clock
        self._targets: list[str] = []
        self._samples: list[CanarySample] = []
        self._marks: list[tuple[str, float]] = []
        self._in_flight: dict[str, set[asyncio.Task[None]]] = {}
        self._skipped = 0
        self._stalls: list[tuple[float, float]] = []  # (due, ran): the recorder itself did not run
        self._loop_task: asyncio.Task[None] | None = None
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self._epoch_offset = time.time() - time.monotonic()
        self._failing_since: float | None = None
        self._outage_seen = False

    # --- control ----------------------------------------------------------------------------------

    def set_targets(self, targets: Sequence[str]) -> None:
        """The targets that serve now; canaries go to these from the next tick on."""
        self._targets = list(dict.fromkeys(targets))

    def mark(self, phase: str) -> float:
        """A phase starts now (it ends where the next one starts, the last at stop); returns when."""
        at = self._clock()
        self._marks.append((phase, at))
        return at

    async def start(self) -> None:
        if self._loop_task is not None:
            return
        self._started_at = self._clock()
        self._loop_task = asyncio.create_task(self._run(), name="canary-recorder")

    async def stop(self) -> None:
        if self._loop_task is None or self._stopped_at is not None:
            return
        self._stopped_at = self._clock()
        self._loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._loop_task
        in_flight = [t for tasks in self._in_flight.values() for t in tasks]
        if in_flight:
            _, late = await asyncio.wait(in_flight, timeout=STOP_GRACE_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def until_answered(self, since: float, timeout_s: float) -> bool:
        """Wait until every target has answered (a success: what ends an outage) to a canary sent
        at or after `since` (this recorder's clock), at most `timeout_s`; True when they all have.

        A job that stops its probe right after the engine says it serves again would end the outage
        at that stop, and keep no answer from after the change: this closes it on an observation."""
        give_up = self._clock() + timeout_s
        while True:
            answered = {s.target for s in self._samples if s.sent_at >= since and s.ok}
            if all(t in answered for t in self._targets):
                return True
            if self._clock() >= give_up or self._loop_task is None or self._stopped_at is not None:
                return False
            await asyncio.sleep(min(self.interval_s / 2, 0.05))

    async def __aenter__(self) -> CanaryRecorder:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- reading ----------------------------------------------------------------------------------

    @property
    def samples(self) -> list[CanarySample]:
        return list(self._samples)

    def live(self) -> LiveView:
        last = self._samples[-1] if self._samples else None
        now = self._clock()
        return LiveView(
            sent=len(self._samples),
            failed=sum(1 for s in self._samples if not s.ok),
            last_ok=None if last is None else last.ok,
            failing_for_s=None if self._failing_since is None else now - self._failing_since,
            last_status=last.status if last else None,
            last_detail=last.detail if last else None,
            outage_seen=self._outage_seen,
        )

    def figures(self) -> ProbeFigures:
        start = self._started_at if self._started_at is not None else self._clock()
        end = self._stopped_at if self._stopped_at is not None else self._clock()
        end = max([end, *(s.done_at for s in self._samples)])
        return probe_figures(
            self._samples,
            start=start,
            end=end,
            interval_s=self.interval_s,
            deadline_s=self.deadline_s,
            marks=self._marks,
            skipped=self._skipped,
            stalls=self._stalls,
            epoch_offset=self._epoch_offset,
        )

    # --- sending ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        next_at = self._clock()
        while True:
            for target in self._targets:
                flying = self._in_flight.setdefault(target, set())
                if len(flying) >= self.max_in_flight:
                    self._skipped += 1
                    continue
                task = asyncio.create_task(self._one(target))
                flying.add(task)
                task.add_done_callback(flying.discard)
            next_at += self.interval_s
            delay = next_at - self._clock()
            if -delay >= max(STALL_INTERVALS * self.interval_s, STALL_MIN_S):
                self._stalls.append((next_at, next_at - delay))
            if delay < 0:  # late (a loaded machine): go on from now rather than burst
                next_at = self._clock()
                delay = 0.0
            await asyncio.sleep(delay)

    async def _one(self, target: str) -> None:
        sent_at = self._clock()
        try:
            result = await asyncio.wait_for(self.canary.send(target), timeout=self.timeout_s)
        except TimeoutError:
            result = CanaryResult(ok=False, detail=f"timeout: no answer within {self.timeout_s:g}s")
        except asyncio.CancelledError:
            if self._stopped_at is not None and self._clock() - sent_at > self.deadline_s:
                self._record(
                    target, sent_at, CanaryResult(ok=False, detail="no answer when the probe stopped")
                )
            raise
        except Exception as exc:  # the canary's own failure to reach the target
            result = CanaryResult(ok=False, detail=f"{exc.__class__.__name__}: {exc}"[:200])
        self._record(target, sent_at, result)

    def _record(self, target: str, sent_at: float, result: CanaryResult) -> None:
        self._samples.append(
            CanarySample(
                target=target,
                sent_at=sent_at,
                done_at=self._clock(),
                ok=result.ok,
                status=result.status,
                detail=result.detail,
            )
        )
        if result.ok:
            self._failing_since = None
        else:
            self._outage_seen = True
            if self._failing_since is None:
                self._failing_since = sent_at
