"""The serving thread of the reference engine (`engine_agent.engine.ReferenceEngine`): one lock-step
iteration after another (the control all-reduce, then a real step with every rank's tokens or a dummy
step and a short sleep), and what an iteration does to the engine: a pause or the armed boundary
taken, a step's results handed to their requests, a broken generation left at once.

A mixin: the state it reads and writes is the engine's own, always under the engine's condition
(`_cond`); the engine's control surface (pause, arm, switch, leave) is in `engine.py`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from engine_agent import lockstep, moe
from engine_agent.engine_stats import EngineCounters
from engine_agent.groups import CommGroup, abort_group
from engine_agent.protocol import AgentState, EngineConfig
from engine_agent.serving import ActiveGeneration, ArmedSwitch, EngineUnavailable, InferResult, PausedAt

log = logging.getLogger("engine_agent.engine")  # the engine's log, as before the split

# Between dummy steps: short at first (a burst of requests keeps latency low), longer once the whole
# generation has been idle a while (many agents on few cores stay cheap). A submit or pause wakes at once.
IDLE_SLEEP_S = 0.002
IDLE_SLEEP_LONG_S = 0.02
IDLE_STREAK_BEFORE_LONG = 100
MAX_TOKENS_PER_STEP = 256


@dataclass
class QueuedRequest:
    """One `submit` waiting for a step."""

    tokens: torch.Tensor
    future: Future[InferResult]


class ServingLoop:
    """The serving thread's side of the reference engine (see module doc)."""

    config: EngineConfig
    device: torch.device
    counters: EngineCounters
    _cond: threading.Condition
    _queue: collections.deque[QueuedRequest]
    _state: AgentState
    _active: ActiveGeneration | None
    _layers: list[moe.LayerView] | None
    _drain_before_pause: bool
    _pause_requested: bool
    _pause_requested_at: float
    _paused_at: PausedAt | None
    _armed_for: int
    _arm_in_flight: bool
    _armed_switch: ArmedSwitch | None
    _switched_at: PausedAt | None
    _serving_since: float | None
    _admitting: bool
    _on_stall: Callable[[ActiveGeneration], None] | None
    _stopped: bool
    _iterations_since_start: int
    _slow_steps: int
    _slow_step_s: float
    _load: torch.Tensor
    _step_ms: collections.deque[float]
    _on_paused: Callable[[PausedAt], None] | None
    _on_step: Callable[[int], None] | None
    _on_broken: Callable[[ActiveGeneration, Exception], None] | None

    def _loop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the current device is per thread
        idle_streak = 0
        while True:
            with self._cond:
                while not self._stopped and self._state != AgentState.serving:
                    self._cond.wait()
                if self._stopped:
                    return
                active = self._active
                layers = self._layers
                batch = self._take_batch()
                # Every member stepped since the last switch or resume: the serving deadline applies.
                settled = self._iterations_since_start > 0
                pause_flag = int(self._pause_requested)
                hold_flag = int(self._drain_before_pause and (bool(self._queue) or bool(batch)))
                armed_for = self._armed_for
                self._arm_in_flight = armed_for > 0
            assert active is not None and layers is not None
            timeout_s = active.group.serving_timeout_s if settled else None
            try:
                served = self._iteration(active, layers, batch, pause_flag, hold_flag, armed_for, timeout_s)
            except Exception as exc:  # a broken group: nothing more this generation can serve
                self._end_arm_flight()
                self._fail_generation(active, batch, exc)
                continue
            if armed_for:
                self._end_arm_flight()
            idle_streak = 0 if served else idle_streak + 1
            if not served:
                with self._cond:
                    self._queue.extendleft(reversed(batch))  # paused before the step: keep order
                    # Just switched at the armed boundary (no step yet): the first step goes at once.
                    settle = self._iterations_since_start == 0
                    busy = bool(self._queue) or self._pause_requested or settle
                    if self._state == AgentState.serving and not busy:
                        long_idle = idle_streak > IDLE_STREAK_BEFORE_LONG
                        self._cond.wait(IDLE_SLEEP_LONG_S if long_idle else IDLE_SLEEP_S)

    def _end_arm_flight(self) -> None:
        with self._cond:
            self._arm_in_flight = False
            self._cond.notify_all()

    def _take_batch(self) -> list[QueuedRequest]:
        batch: list[QueuedRequest] = []
        tokens = 0
        while self._queue and (not batch or tokens + self._queue[0].tokens.shape[0] <= MAX_TOKENS_PER_STEP):
            request = self._queue.popleft()
            batch.append(request)
            tokens += request.tokens.shape[0]
        return batch

    def _iteration(
        self,
        active: ActiveGeneration,
        layers: list[moe.LayerView],
        batch: list[QueuedRequest],
        pause_flag: int,
        hold_flag: int,
        armed_for: int = 0,
        timeout_s: float | None = None,
    ) -> bool:
        """One lock-step iteration. False when it did no real step (paused, or nothing anywhere)."""
        started = time.perf_counter()
        if self._slow_steps:  # test-only: a slow step (`slow_down`)
            self._slow_steps -= 1
            _compute_for(self._slow_step_s)
        group = active.group
        my_count = sum(r.tokens.shape[0] for r in batch)
        boundary = lockstep.agree_boundary(
            group,
            self.device,
            pause_flag=pause_flag,
            hold_flag=hold_flag,
            armed_for=armed_for,
            my_count=my_count,
            timeout_s=timeout_s,
        )
        if boundary.pause:
            self._enter_pause(by_peer=pause_flag == 0)
            return False
        if boundary.armed:
            if not self._switch_at_boundary():
                self._enter_pause(by_peer=False, armed=True)
            return False
        with self._cond:
            self._iterations_since_start += 1
            self.counters.last_step_at = time.time()  # the step's agreement collective completed
            if self._iterations_since_start == 1:
                self._serving_since = time.monotonic()
                self._cond.notify_all()
        if sum(boundary.per_rank) == 0:
            self.counters.dummy_steps += 1
            return False
        if batch:
            hidden_own = batch[0].tokens if len(batch) == 1 else torch.cat([r.tokens for r in batch])
        else:
            hidden_own = torch.empty(0, self.config.hidden_size, dtype=torch.float32, device=self.device)
        hidden_own, loads, from_graphs = lockstep.moe_step(
            self.config, group, layers, hidden_own, boundary.per_rank, self.device, timeout_s, active.graphs
        )
        with self._cond:
            self._load += loads
        mine = self._to_host(hidden_own, group, timeout_s)
        with self._cond:
            self.counters.steps += 1
            self.counters.graph_steps += int(from_graphs)
            step = self.counters.steps
            self.counters.tokens_served += my_count
            self.counters.requests_served += len(batch)
            self._step_ms.append((time.perf_counter() - started) * 1000.0)
        row = 0
        for request in batch:
            n = request.tokens.shape[0]
            request.future.set_result(InferResult(mine[row : row + n], active.generation, group.rank, step))
            row += n
        if self._on_step is not None:
            self._on_step(step)
        return True

    def _to_host(self, rows: torch.Tensor, group: CommGroup, timeout_s: float | None) -> torch.Tensor:
        """The step's outputs on the host: the step's one wait for the device (besides the control
        all-reduce), held to the collective deadline (a peer that stalls a collective fails it)."""
        if self.device.type != "cuda":
            return rows.cpu()
        host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        host.copy_(rows, non_blocking=True)
        group.wait_device(timeout_s)
        return host

    def _install(self, new: ActiveGeneration, layers: list[moe.LayerView]) -> ActiveGeneration | None:
        """Serve `new` from `layers` (the caller holds `_cond`; the loop holds no group now). Returns
        the retired generation."""
        retired, self._active, self._layers = self._active, new, layers
        if self._on_stall is not None:
            stall = self._on_stall
            new.group.on_slow = lambda: stall(new)
        self.counters.last_error = None  # an old generation's failure is history once a new one serves
        self.counters.failed_generation = None
        self.counters.last_step_at = None
        self._pause_requested = False
        self._armed_for = 0
        self._armed_switch = None
        self._paused_at = None
        self._admitting = True
        self._drain_before_pause = False
        self._state = AgentState.serving
        self._iterations_since_start = 0
        self._cond.notify_all()
        return retired

    def _switch_at_boundary(self) -> bool:
        """At the armed boundary, with the new generation handed to `arm`: switch to it here, in the
        serving thread, and step on (the worker's `wait_armed_boundary` sees the boundary taken)."""
        with self._cond:
            handoff = self._armed_switch
            if handoff is None or handoff.views is None or handoff.new.generation != self._armed_for:
                return False
            now = time.monotonic()
            handoff.paused = PausedAt(
                wall=time.time(), monotonic=now, boundary_wait_ms=0.0, by_peer=False, armed=True
            )
            handoff.retired = self._install(handoff.new, handoff.views)
            handoff.switched_monotonic = time.monotonic()
            self._switched_at = handoff.paused
            self.counters.pauses += 1
        return True

    def _enter_pause(self, *, by_peer: bool, armed: bool = False) -> None:
        now = time.monotonic()
        with self._cond:
            # Armed: the engine served up to the agreed boundary, so nothing was spent waiting for it.
            requested_at = self._pause_requested_at if not (by_peer or armed) else now
            paused = PausedAt(
                wall=time.time(),
                monotonic=now,
                boundary_wait_ms=(now - requested_at) * 1000.0,
                by_peer=by_peer,
                armed=armed,
            )
            self._paused_at = paused
            self._state = AgentState.paused
            self.counters.pauses += 1
            self._cond.notify_all()
        if self._on_paused is not None:
            self._on_paused(paused)

    def _fail_generation(self, active: ActiveGeneration, batch: list[QueuedRequest], exc: Exception) -> None:
        log.error("serving generation %s failed: %s", active.generation, exc)
        with self._cond:
            if self._active is not active:
                return
            self.counters.last_error = f"{type(exc).__name__}: {exc}"
            self.counters.failed_generation = active.generation
            self._state = AgentState.idle
            self._active, self._layers = None, None
            queued = batch + list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for request in queued:
            request.future.set_exception(EngineUnavailable(f"generation {active.generation} broke: {exc}"))
        # Give the group up at once; NCCL's abort also ends the peers' waits (gloo's cannot: the agent's
        # notice to the peers does, `on_broken`).
        try:
            abort_group(active.group, f"{type(exc).__name__}: {exc}"[:300])
        except Exception as abort_error:
            log.warning("aborting the broken group of generation %s: %s", active.generation, abort_error)
        if self._on_broken is not None:
            try:
                self._on_broken(active, exc)
            except Exception:
                log.exception("reporting the broken generation %s failed", active.generation)


def _compute_for(seconds: float) -> None:
    """Python work in this thread for `seconds` (it takes the GIL as a busy step does, and gives it up
    at each switch interval as any Python thread)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        sum(range(1000))
