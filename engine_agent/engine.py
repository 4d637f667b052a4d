"""The reference MoE engine: one DP rank of one EP group, implementing `engine_agent.serving`'s
`ServingEngine`.

Its loop runs in lock step with the other members of the active generation: every iteration starts
with a small control all-reduce over the EP group (`engine_agent.lockstep`) carrying [pause requested,
hold (draining before a pause), armed, armed generation, tokens pending per rank]. When any member has
asked for a pause (and no draining member still holds tokens), every member stops at that same
boundary: a pause never strands a peer inside a collective. The same all-reduce carries the
engine-agreed commit: once every member is armed for the same new generation (`arm`), the first
boundary at which the sums say so is where every member stops for the switch, with no coordinator
exchange inside the window. With tokens anywhere, a step dispatches every rank's tokens (all-to-all),
each rank computes its local experts' share, an all-to-all combines them and each rank keeps its own
rows. With no tokens anywhere the iteration is a dummy step followed by a short sleep (cheap for many
agents on few cores).

Every collective has a deadline: the first iteration after a switch or resume waits up to the group's
`timeout_s` (the job's `collective_s`: a peer may still be switching); later ones, with every member
known to be stepping, up to its `serving_timeout_s`, so a stalled peer cannot hold the others longer.
A generation whose collective fails or times out, or that a peer reports broken (`abandon`), is left
at once; `on_broken` tells the agent, which tells the peers and the coordinator.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import torch

from engine_agent import moe, step_graphs
from engine_agent.engine_stats import STEP_TIMES_KEPT, EngineCounters, step_ms_summary
from engine_agent.grouped import Kernel
from engine_agent.groups import CollectiveTimeout
from engine_agent.protocol import AgentState, EngineConfig
from engine_agent.serving import ActiveGeneration, ArmedSwitch, EngineUnavailable, InferResult, PausedAt
from engine_agent.serving_loop import QueuedRequest, ServingLoop


class ReferenceEngine(ServingLoop):
    """The reference MoE engine (see module doc); its serving thread runs `ServingLoop._loop`."""

    def __init__(
        self,
        config: EngineConfig,
        device: torch.device,
        *,
        on_paused: Callable[[PausedAt], None] | None = None,
        on_step: Callable[[int], None] | None = None,
        on_broken: Callable[[ActiveGeneration, Exception], None] | None = None,
        on_stall: Callable[[ActiveGeneration], None] | None = None,
        grouped_step: bool = False,
        graph_buckets: list[int] | None = None,
    ) -> None:
        self.config = config
        self.device = device
        self.grouped_step = grouped_step  # a layer's experts batched (`moe.GroupedExperts`)
        # Token counts the step is captured for, per generation (None: no graphs). Without CUDA the
        # buckets' padded buffers run eagerly (tests of the bucketing).
        self.graph_buckets = graph_buckets
        self._graph_kernels: dict[int, Kernel] = {}  # the expert kernel chosen for each bucket
        self._graph_stream: torch.cuda.Stream | None = None  # every generation's capture runs on it
        self._routers = [moe.router_weights(config, device, layer) for layer in range(config.num_moe_layers)]
        self._on_paused = on_paused
        self._on_step = on_step
        self._on_broken = on_broken
        self._on_stall = on_stall  # a serving collective waits unusually long: who stalled?
        self._cond = threading.Condition()
        self._queue: collections.deque[QueuedRequest] = collections.deque()
        self._state = AgentState.idle
        self._active: ActiveGeneration | None = None
        self._layers: list[moe.LayerView] | None = None
        self._admitting = True
        self._drain_before_pause = False
        self._pause_requested = False
        self._pause_requested_at = 0.0
        self._paused_at: PausedAt | None = None
        self._armed_for = 0  # the new generation this engine is armed to switch to (0: not armed)
        self._arm_in_flight = False  # the iteration running now carries this engine's arm
        self._armed_switch: ArmedSwitch | None = None  # the new generation the loop switches to itself
        self._switched_at: PausedAt | None = None  # the armed boundary where the loop switched by itself
        self._serving_since: float | None = None  # monotonic: the first iteration after a switch/resume
        self._stopped = False
        self._iterations_since_start = 0  # lock-step iterations since the last switch or resume
        self._slow_steps, self._slow_step_s = 0, 0.0  # test-only: slow (not frozen) steps to come
        self.counters = EngineCounters()
        # Tokens routed per layer and logical expert, summed on the device step by step (read on demand).
        self._load = torch.zeros(
            config.num_moe_layers, config.num_logical_experts, dtype=torch.int64, device=device
        )
        self._step_ms: collections.deque[float] = collections.deque(maxlen=STEP_TIMES_KEPT)
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
        staged = self._to_device(tokens)
        with self._cond:
            if self._active is None or self._stopped:
                raise EngineUnavailable("this engine is in no generation (idle)")
            if not self._admitting:
                raise EngineUnavailable("this engine is leaving and no longer admits requests")
            self._queue.append(QueuedRequest(staged, future))
            self._cond.notify_all()
        return future

    def _to_device(self, tokens: torch.Tensor) -> torch.Tensor:
        """The request's tokens on the engine's device, as float32. On CUDA through pinned staging: a
        copy from pageable memory blocks the caller for the whole transfer (and waits for the step in
        flight on the same stream); from pinned memory it is queued, ahead of the step that reads it."""
        if self.device.type != "cuda":
            return tokens.to(self.device, torch.float32)
        staged = torch.empty(tokens.shape, dtype=torch.float32, pin_memory=True)
        staged.copy_(tokens)  # a host copy (and the dtype's conversion), no device wait
        return staged.to(self.device, non_blocking=True)  # the allocator keeps `staged` until it is done

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
            self._armed_for = 0
            self._armed_switch = None
            self._paused_at = None
            if self._state == AgentState.paused:
                self._state = AgentState.serving
                self._iterations_since_start = 0
            self._cond.notify_all()

    def slow_down(self, steps: int, step_s: float) -> None:
        """Test-only (`/v1/faults`): the next `steps` iterations each compute `step_s` in the serving
        thread before their collective, as a slow step under load would; the engine still heartbeats
        and answers (issue 39: a slow step is not a freeze)."""
        with self._cond:
            self._slow_steps, self._slow_step_s = steps, step_s

    def abandon(self, generation: int, reason: str) -> bool:
        """Give up `generation`'s group (a peer found it broken): the loop leaves it within one wait
        slice, or at its next collective if it is paused. False when this engine does not serve it."""
        with self._cond:
            active = self._active
        if active is None or active.generation != generation:
            return False
        active.group.abandon(reason)
        return True

    # ---- the engine-agreed commit ----------------------------------------------------------------

    def arm(self, generation: int, switch: ArmedSwitch | None = None) -> None:
        """Be ready to stop for the switch to `generation` at the first step boundary at which every
        member of the active generation is armed for it. Serving goes on until then. With `switch`
        (the new generation, built ahead), the serving thread switches to it at that boundary itself
        and steps on at once: the window is the switch and one step, with no thread hand-off."""
        if switch is not None and switch.views is None:
            new = switch.new
            switch.views = self.views_for(new.placements, new.weights, rank=new.rank, stacks=new.stacks)
        with self._cond:
            if self._state != AgentState.serving or self._active is None:
                raise EngineUnavailable(f"cannot arm an engine that is {self._state}")
            self._armed_for = generation
            self._armed_switch = switch
            self._switched_at = None
            self._cond.notify_all()

    def wait_armed_boundary(self, timeout_s: float, withdraw_s: float) -> PausedAt | None:
        """Wait until this engine stopped at the armed boundary (returned), or `timeout_s` passed, or
        the arm was withdrawn: then withdraw it and return None, unless the iteration running at that
        moment still took the boundary (every member saw the same sums, so the others stopped too:
        then it is returned all the same)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._switched_at is not None:
                    return self._switched_at
                if self._paused_at is not None and self._paused_at.armed:
                    return self._paused_at
                if self._state != AgentState.serving:
                    raise EngineUnavailable(f"the engine stopped serving while armed ({self._state})")
                left = deadline - time.monotonic()
                if left <= 0 or self._armed_for == 0:
                    break
                self._cond.wait(left)
        if self.withdraw_arm(withdraw_s):
            return None
        with self._cond:  # the iteration in flight took the boundary (and may have switched there)
            return self._switched_at or self._paused_at

    def withdraw_arm(self, timeout_s: float) -> bool:
        """Disarm. True when no armed boundary was (or will be) taken: the iteration in flight, which
        may carry the arm, has ended. False when the boundary was taken (or the wait timed out while
        a collective carrying the arm was still running: the caller must not assume it wasn't)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._armed_for = 0
            self._armed_switch = None
            while self._arm_in_flight and self._state == AgentState.serving:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self._switched_at is None and not (self._paused_at is not None and self._paused_at.armed)

    def views_for(
        self,
        placements: list[list[list[int]]],
        weights: dict[int, torch.Tensor],
        *,
        rank: int,
        stacks: dict[int, moe.ExpertStack],
    ) -> list[moe.LayerView]:
        """What a generation with these placements and weights serves each layer from (built ahead of
        the switch: `switch(views=...)`)."""
        return moe.layer_views(
            self.config,
            placements,
            weights,
            self._routers,
            self.device,
            rank=rank,
            stacks=stacks if self.grouped_step else None,
        )

    @property
    def captures_graphs(self) -> bool:
        return self.graph_buckets is not None

    def capture_graphs(self, views: list[moe.LayerView], *, rank: int) -> step_graphs.StepGraphs | None:
        """The step's graphs for a generation that serves from `views` as `rank` (built ahead of the
        switch, `ActiveGeneration.graphs`); None when this engine captures none."""
        if self.graph_buckets is None:
            return None
        graphs = step_graphs.capture(
            self.config, views, rank, self.device, self.graph_buckets,
            graphs=self.device.type == "cuda", kernels=self._graph_kernels, stream=self._capture_stream(),
        )  # fmt: skip
        self._graph_kernels.update(graphs.kernels)  # timed once: later generations reuse the choice
        return graphs

    def _capture_stream(self) -> torch.cuda.Stream | None:
        if self.device.type != "cuda":
            return None
        if self._graph_stream is None:
            self._graph_stream = torch.cuda.Stream(self.device)
        return self._graph_stream

    def switch(
        self, new: ActiveGeneration, views: list[moe.LayerView] | None = None
    ) -> ActiveGeneration | None:
        """Swap groups, placement, weights and step graphs together and serve the new generation. Only
        while paused or idle (the loop holds no group then). Returns the retired generation (its graphs
        are released by the caller's cleanup, not here). `views`: the layers built ahead for `new`
        (`views_for`), else built here."""
        layers = views or self.views_for(new.placements, new.weights, rank=new.rank, stacks=new.stacks)
        with self._cond:
            if self._state == AgentState.serving:
                raise RuntimeError("switch needs a paused or idle engine")
            return self._install(new, layers)

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

    def serving_since(self) -> float | None:
        """When (monotonic) the loop completed its first iteration since the last switch or resume: the
        end of a stopped window, stamped by the serving thread itself. None until then."""
        with self._cond:
            return self._serving_since if self._iterations_since_start > 0 else None

    def leave(self, *, fail_queued: bool) -> ActiveGeneration | None:
        """Leave the generation and go idle (paused or idle only). Queued requests fail with 503."""
        with self._cond:
            if self._state == AgentState.serving:
                raise RuntimeError("leave needs a paused or idle engine")
            retired, self._active, self._layers = self._active, None, None
            self._state = AgentState.idle
            self._pause_requested = False
            self._armed_for = 0
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
        """Tokens routed to each logical expert, summed over the layers."""
        with self._cond:
            return [int(v) for v in self._load.sum(dim=0).tolist()]

    def layer_expert_load(self) -> list[list[int]]:
        with self._cond:
            return [[int(v) for v in layer] for layer in self._load.tolist()]

    def free_kv_bytes(self) -> int:
        """Memory a KV cache could still take here: free device memory on GPU, available RAM on CPU."""
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free)
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))

    def step_ms(self) -> dict[str, float] | None:
        """p50/p99 duration of the recent real steps (control all-reduce to results), None before any."""
        with self._cond:
            times = list(self._step_ms)
        return step_ms_summary(times)

    def step_times_ms(self) -> list[float]:
        """The recent real steps' durations, oldest first (at most `STEP_TIMES_KEPT`)."""
        with self._cond:
            return list(self._step_ms)

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
