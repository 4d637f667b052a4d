"""The serving engine behind a narrow interface, and the reference MoE engine that implements it.

The reconfiguration executor only uses `ServingEngine`: pause at a step boundary, switch (groups,
placement and weights together), resume, leave, submit, expert load, free KV bytes. A production
engine can be plugged in behind the same interface.

The reference engine is one DP rank of one EP group. Its loop runs in lock step with the other members
of the active generation: every iteration starts with a small control all-reduce over the EP group
carrying [pause requested, hold (draining before a pause), tokens pending per rank]. When any member
has asked for a pause (and no draining member still holds tokens), every member stops at that same
boundary: a pause never strands a peer inside a collective. With tokens anywhere, a step gathers all
tokens (padded all-reduce), each rank computes its local experts' share, an all-reduce combines them
and each rank keeps its own rows. With no tokens anywhere the iteration is a dummy step followed by a
short sleep (cheap for many agents on few cores).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine_agent import moe
from engine_agent.groups import CollectiveTimeout, CommGroup
from engine_agent.protocol import AgentState, EngineConfig

log = logging.getLogger(__name__)

# Between dummy steps: short at first (a burst of requests keeps latency low), longer once the whole
# generation has been idle a while (many agents on few cores stay cheap). A submit or pause wakes at once.
IDLE_SLEEP_S = 0.002
IDLE_SLEEP_LONG_S = 0.02
IDLE_STREAK_BEFORE_LONG = 100
MAX_TOKENS_PER_STEP = 256


class EngineUnavailable(RuntimeError):
    """The engine cannot serve this request (in no generation, left, or not admitting): HTTP 503."""


@dataclass
class ActiveGeneration:
    """Everything one generation's serving needs, switched as one piece."""

    generation: int
    group: CommGroup
    members: list[str]
    placement: list[list[int]]
    weights: dict[int, torch.Tensor]  # logical expert -> packed buffer held by this rank

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.size


@dataclass
class InferResult:
    outputs: torch.Tensor
    generation: int
    rank: int
    step: int


@dataclass
class PausedAt:
    wall: float  # epoch seconds
    monotonic: float
    boundary_wait_ms: float
    by_peer: bool  # stopped by another member's pause request before ours arrived


class ServingEngine(Protocol):
    """What the reconfiguration executor needs from an engine."""

    @property
    def state(self) -> AgentState: ...
    @property
    def active(self) -> ActiveGeneration | None: ...
    def submit(self, tokens: torch.Tensor) -> Future[InferResult]: ...
    def set_admitting(self, admitting: bool) -> None: ...
    def set_drain_before_pause(self, drain: bool) -> None: ...
    def pause(self, timeout_s: float) -> PausedAt: ...
    def resume(self) -> None: ...
    def switch(self, new: ActiveGeneration) -> ActiveGeneration | None: ...
    def leave(self, *, fail_queued: bool) -> ActiveGeneration | None: ...
    def wait_serving(self, timeout_s: float) -> bool: ...
    def expert_load(self) -> list[int]: ...
    def free_kv_bytes(self) -> int: ...
    def stop(self) -> None: ...


@dataclass
class _Request:
    tokens: torch.Tensor
    future: Future[InferResult]


@dataclass
class EngineCounters:
    steps: int = 0
    dummy_steps: int = 0
    requests_served: int = 0
    tokens_served: int = 0
    pauses: int = 0
    last_error: str | None = None
    expert_load: list[int] = field(default_factory=list)


class ReferenceEngine:
    """The reference MoE engine (see module doc)."""

    def __init__(
        self,
        config: EngineConfig,
        device: torch.device,
        *,
        on_paused: Callable[[PausedAt], None] | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self.device = device
        self._router = moe.router_weights(config, device)
        self._on_paused = on_paused
        self._on_step = on_step
        self._cond = threading.Condition()
        self._queue: collections.deque[_Request] = collections.deque()
        self._state = AgentState.idle
        self._active: ActiveGeneration | None = None
        self._table: moe.ReplicaTable | None = None
        self._admitting = True
        self._drain_before_pause = False
        self._pause_requested = False
        self._pause_requested_at = 0.0
        self._paused_at: PausedAt | None = None
        self._stopped = False
        self._iterations_since_start = 0  # lock-step iterations since the last switch or resume
        self.counters = EngineCounters(expert_load=[0] * config.num_logical_experts)
        self._thread = threading.Thread(target=self._loop, name="serving-loop", daemon=True)
        self._thread.start()

    # ---- what the executor and the API see -------------------------------------------------------

    @property
    def state(self) -> AgentState:
        return self._state

    @property
    def active(self) -> ActiveGeneration | None:
        return self._active

    def submit(self, tokens: torch.Tensor) -> Future[InferResult]:
        """Queue a request. While paused it waits (stalls) for the resume; it is never failed by a
        pause. Raises EngineUnavailable when this engine serves no generation or stopped admitting."""
        if tokens.ndim != 2 or tokens.shape[1] != self.config.hidden_size:
            raise ValueError(f"tokens must be [n, {self.config.hidden_size}], got {list(tokens.shape)}")
        future: Future[InferResult] = Future()
        with self._cond:
            if self._active is None or self._stopped:
                raise EngineUnavailable("this engine is in no generation (idle)")
            if not self._admitting:
                raise EngineUnavailable("this engine is leaving and no longer admits requests")
            self._queue.append(_Request(tokens.to(self.device, torch.float32), future))
            self._cond.notify_all()
        return future

    def set_admitting(self, admitting: bool) -> None:
        with self._cond:
            self._admitting = admitting

    def set_drain_before_pause(self, drain: bool) -> None:
        """A leaving engine (leave policy finish) holds the pause until its queue is empty."""
        with self._cond:
            self._drain_before_pause = drain
            self._cond.notify_all()

    def pause(self, timeout_s: float) -> PausedAt:
        """Ask every member to stop at the next agreed step boundary and wait until this one has."""
        with self._cond:
            if self._state == AgentState.paused and self._paused_at is not None:
                return self._paused_at
            if self._state != AgentState.serving:
                raise EngineUnavailable(f"cannot pause an engine that is {self._state}")
            self._pause_requested = True
            self._pause_requested_at = time.monotonic()
            self._cond.notify_all()
            deadline = time.monotonic() + timeout_s
            while self._state == AgentState.serving:
                if not self._pause_requested:
                    raise EngineUnavailable("the pause was cancelled (resume or abort) before a boundary")
                left = deadline - time.monotonic()
                if left <= 0:
                    self._pause_requested = False
                    raise CollectiveTimeout(f"no step boundary agreed within {timeout_s:g} s")
                self._cond.wait(left)
            if self._paused_at is None:
                raise EngineUnavailable(f"the engine stopped serving while pausing ({self._state})")
            return self._paused_at

    def resume(self) -> None:
        """Serve the generation still held (after a pause that did not switch)."""
        with self._cond:
            self._pause_requested = False
            self._paused_at = None
            if self._state == AgentState.paused:
                self._state = AgentState.serving
                self._iterations_since_start = 0
            self._cond.notify_all()

    def switch(self, new: ActiveGeneration) -> ActiveGeneration | None:
        """Swap groups, placement and weights together and serve the new generation. Only while
        paused or idle (the loop holds no group then). Returns the retired generation."""
        table = moe.ReplicaTable.build(new.placement, self.config.num_logical_experts, self.device)
        with self._cond:
            if self._state == AgentState.serving:
                raise RuntimeError("switch needs a paused or idle engine")
            retired, self._active, self._table = self._active, new, table
            self._pause_requested = False
            self._paused_at = None
            self._admitting = True
            self._drain_before_pause = False
            self._state = AgentState.serving
            self._iterations_since_start = 0
            self._cond.notify_all()
        return retired

    def wait_serving(self, timeout_s: float) -> bool:
        """Wait until the loop has completed one lock-step iteration since the last switch or resume:
        the moment every member is back (the end of the stopped window). False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._state == AgentState.serving and self._iterations_since_start == 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self._iterations_since_start > 0

    def leave(self, *, fail_queued: bool) -> ActiveGeneration | None:
        """Leave the generation and go idle (paused or idle only). Queued requests fail with 503."""
        with self._cond:
            if self._state == AgentState.serving:
                raise RuntimeError("leave needs a paused or idle engine")
            retired, self._active, self._table = self._active, None, None
            self._state = AgentState.idle
            self._pause_requested = False
            self._paused_at = None
            self._admitting = True
            self._drain_before_pause = False
            queued = list(self._queue)
            self._queue.clear()
        reason = "leave policy abort" if fail_queued else "left the generation"
        for request in queued:
            request.future.set_exception(EngineUnavailable(f"this engine left its generation ({reason})"))
        return retired

    def expert_load(self) -> list[int]:
        with self._cond:
            return list(self.counters.expert_load)

    def free_kv_bytes(self) -> int:
        """Memory a KV cache could still take here: free device memory on GPU, available RAM on CPU."""
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free)
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))

    def queued_requests(self) -> int:
        with self._cond:
            return len(self._queue)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for request in queued:
            request.future.set_exception(EngineUnavailable("the agent is shutting down"))
        self._thread.join(timeout=5)

    # ---- the serving loop ------------------------------------------------------------------------

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
                table = self._table
                batch = self._take_batch()
                pause_flag = int(self._pause_requested)
                hold_flag = int(self._drain_before_pause and (bool(self._queue) or bool(batch)))
            assert active is not None and table is not None
            try:
                served = self._iteration(active, table, batch, pause_flag, hold_flag)
            except Exception as exc:  # a broken group: nothing more this generation can serve
                self._fail_generation(active, batch, exc)
                continue
            idle_streak = 0 if served else idle_streak + 1
            if not served:
                with self._cond:
                    self._queue.extendleft(reversed(batch))  # paused before the step: keep order
                    if self._state == AgentState.serving and not self._queue and not self._pause_requested:
                        long_idle = idle_streak > IDLE_STREAK_BEFORE_LONG
                        self._cond.wait(IDLE_SLEEP_LONG_S if long_idle else IDLE_SLEEP_S)

    def _take_batch(self) -> list[_Request]:
        batch: list[_Request] = []
        tokens = 0
        while self._queue and (not batch or tokens + self._queue[0].tokens.shape[0] <= MAX_TOKENS_PER_STEP):
            request = self._queue.popleft()
            batch.append(request)
            tokens += request.tokens.shape[0]
        return batch

    def _iteration(
        self,
        active: ActiveGeneration,
        table: moe.ReplicaTable,
        batch: list[_Request],
        pause_flag: int,
        hold_flag: int,
    ) -> bool:
        """One lock-step iteration. False when it did no real step (paused, or nothing anywhere)."""
        group = active.group
        my_count = sum(r.tokens.shape[0] for r in batch)
        control = torch.zeros(2 + group.size, dtype=torch.int64, device=self.device)
        control[0] = pause_flag
        control[1] = hold_flag
        control[2 + group.rank] = my_count
        counts = group.allreduce(control).tolist()
        if counts[0] > 0 and counts[1] == 0:
            self._enter_pause(by_peer=pause_flag == 0)
            return False
        with self._cond:
            self._iterations_since_start += 1
            if self._iterations_since_start == 1:
                self._cond.notify_all()
        per_rank = counts[2:]
        total = sum(per_rank)
        if total == 0:
            self.counters.dummy_steps += 1
            return False
        offset = sum(per_rank[: group.rank])
        gathered = torch.zeros(total, self.config.hidden_size, dtype=torch.float32, device=self.device)
        if batch:
            gathered[offset : offset + my_count] = torch.cat([r.tokens for r in batch])
        group.allreduce(gathered)
        partial, experts = moe.local_contribution(
            self.config, self._router, gathered, group.rank, active.placement, table, active.weights
        )
        group.allreduce(partial)
        mine = partial[offset : offset + my_count].cpu()
        load = torch.bincount(
            experts[offset : offset + my_count].reshape(-1).cpu(), minlength=self.config.num_logical_experts
        ).tolist()
        with self._cond:
            self.counters.steps += 1
            step = self.counters.steps
            self.counters.tokens_served += my_count
            self.counters.requests_served += len(batch)
            self.counters.expert_load = [a + b for a, b in zip(self.counters.expert_load, load, strict=True)]
        row = 0
        for request in batch:
            n = request.tokens.shape[0]
            request.future.set_result(InferResult(mine[row : row + n], active.generation, group.rank, step))
            row += n
        if self._on_step is not None:
            self._on_step(step)
        return True

    def _enter_pause(self, *, by_peer: bool) -> None:
        now = time.monotonic()
        with self._cond:
            requested_at = self._pause_requested_at if not by_peer else now
            paused = PausedAt(
                wall=time.time(),
                monotonic=now,
                boundary_wait_ms=(now - requested_at) * 1000.0,
                by_peer=by_peer,
            )
            self._paused_at = paused
            self._state = AgentState.paused
            self.counters.pauses += 1
            self._cond.notify_all()
        if self._on_paused is not None:
            self._on_paused(paused)

    def _fail_generation(self, active: ActiveGeneration, batch: list[_Request], exc: Exception) -> None:
        log.error("serving generation %s failed: %s", active.generation, exc)
        with self._cond:
            if self._active is not active:
                return
            self.counters.last_error = f"{type(exc).__name__}: {exc}"
            self._state = AgentState.idle
            self._active, self._table = None, None
            queued = batch + list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for request in queued:
            request.future.set_exception(EngineUnavailable(f"generation {active.generation} broke: {exc}"))


def held_weights(engine: ServingEngine) -> Mapping[int, torch.Tensor]:
    """The expert buffers of the generation this engine serves now (empty when idle)."""
    active = engine.active
    return active.weights if active is not None else {}
