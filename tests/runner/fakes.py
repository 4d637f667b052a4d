"""In-process FAKE agents, fleet and launcher for testing the runner's flow without processes.

`FakeAgent` stands in for one engine agent: it implements the agent client surface the runner uses
(`AgentClient`'s read and long-poll methods, and the one `_step` every step call sends its request
through) on the protocol's own models, and moves through the
agent's phases (the protocol's `MOVES`) at once unless told otherwise (`faults`). It keeps what a real
agent keeps: the active generation, rank, whether serving is paused, the current job's status and its
pause interval. It does not run an engine: serving, collectives and weights are the real agent's,
tested in tests/agent and tests/e2e.

Faults, one name each (set with `agent.faults.add(...)`):
- `unreachable`: every call raises `AgentUnreachable` (the process is gone);
- `silent`: every call raises `AgentSilent` (frozen: connected, never answering);
- `fail_prepare` / `fail_sync` / `fail_pause` / `fail_switch`: that step ends `failed` with an error;
- `hang_prepare`: prepare stays `preparing` (at step "transfer") until aborted;
- `silent_pause`: the pause is never confirmed (stays `pausing`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from pydantic import BaseModel

from app.agents.client import AgentClient
from app.agents.errors import AgentProblem, AgentSilent, AgentUnreachable
from app.agents.fleet import Fleet
from app.launchers.base import EngineHandle, Launcher, LaunchError, LaunchSpec
from engine_agent.protocol import (
    ARMED_ONWARD,
    COMMITTING,
    MOVES,
    TERMINAL_PHASES,
    AgentError,
    AgentInfo,
    AgentState,
    CleanupState,
    CleanupStatus,
    EngineConfig,
    Operation,
    PauseInterval,
    Platform,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
    Role,
    Settlement,
    StoreAddress,
    TransferBackend,
    is_settled,
)

INJECTED = "injected-failure"
READS = ("health", "info", "reconfig", "watch", "cleanup")  # calls that are not steps
OPERATION_AT = {operation.path: operation for operation in Operation}  # the client posts each step here


class FakeAgent(AgentClient):
    """One fake engine agent (see the module docstring). `calls` lists `(operation, job_id)`."""

    def __init__(
        self,
        engine_id: str,
        *,
        engine: EngineConfig,
        generation: int = 0,
        rank: int | None = None,
        world_size: int = 0,
        port: int = 20000,
        data_host: str = "127.0.0.1",
    ) -> None:
        super().__init__(engine_id, f"http://fake-agent/{engine_id}")
        self.data_host = data_host  # its data address: its failure domain to the planner
        self.long_poll = True
        self.engine = engine
        self.generation = generation
        self.rank = rank
        self.world_size = world_size
        self.paused = False
        self.port = port
        self.faults: set[str] = set()
        self.calls: list[tuple[str, str | None]] = []
        self.request: PrepareRequest | None = None
        self.status: ReconfigStatus | None = None
        self._pause_started: float | None = None
        self._changed: asyncio.Event | None = None
        # Called with the operation name before each step is handled (lets a test act at that moment).
        self.before: Callable[[str], None] | None = None
        # Each step's request, by operation (`_step`).
        self._handlers: dict[Operation, Callable[[Any], ReconfigStatus]] = {
            Operation.prepare: self._prepare,
            Operation.sync: lambda ref: self._sync(ref.job_id),
            Operation.pause: lambda request: self._pause(request.job_id),
            Operation.switch: lambda ref: self._switch(ref.job_id),
            Operation.arm: lambda request: self._arm(request.job_id),
            Operation.abort: lambda ref: self._abort(ref.job_id),
            Operation.resume: lambda ref: self._resume(ref.job_id),
        }

    # --- what the agent reports -------------------------------------------------------------------

    @property
    def state(self) -> AgentState:
        if self.paused:
            return AgentState.paused
        return AgentState.serving if self.rank is not None else AgentState.idle

    def _check(self, operation: str, job_id: str | None = None) -> None:
        self.calls.append((operation, job_id))
        if "unreachable" in self.faults:
            raise AgentUnreachable(self.engine_id, f"{operation}: fake agent is down")
        if "silent" in self.faults:
            raise AgentSilent(self.engine_id, f"{operation}: fake agent does not answer")
        if self.before is not None:
            self.before(operation)

    async def health(self, *, timeout_s: float | None = None) -> bool:
        self._check("health")
        return True

    async def info(self, *, timeout_s: float | None = None) -> AgentInfo:
        self._check("info")
        return AgentInfo(
            engine_id=self.engine_id,
            url=self.base_url,
            pid=1,
            platform=Platform.cpu,
            device="cpu",
            state=self.state,
            generation=self.generation,
            rank=self.rank,
            world_size=self.world_size,
            warmup_policy=None,
            placement=[[e] for e in range(self.engine.num_logical_experts)] if self.rank is not None else [],
            engine=self.engine,
            store=StoreAddress(host=self.data_host, port=self.port),
            transfer_backends=[TransferBackend.gloo],
            serving_steps=0,
            requests_served=0,
            expert_load=[0] * self.engine.num_logical_experts,
            free_kv_bytes=1 << 20,
            reconfig=self.status,
            cleanup=CleanupStatus(state=CleanupState.idle),
        )

    async def reconfig(self, *, timeout_s: float | None = None) -> ReconfigStatus | None:
        self._check("reconfig")
        return self.status.model_copy() if self.status is not None else None

    async def cleanup_status(self, *, timeout_s: float | None = None) -> CleanupStatus:
        self._check("cleanup")
        return CleanupStatus(state=CleanupState.idle)

    async def watch(
        self,
        job_id: str,
        phases: Collection[ReconfigPhase],
        *,
        wait_s: float,
        timeout_s: float | None = None,
    ) -> ReconfigStatus | None:
        """Held until the job settles against `phases` or `wait_s` passes, as the real agent does."""
        self._check("watch", job_id)
        give_up = time.monotonic() + wait_s
        while is_settled(self.status, job_id, phases) is Settlement.pending:
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                break
            changed = self._changed = self._changed or asyncio.Event()
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                break
        status = self.status
        return status.model_copy() if status is not None and status.job_id == job_id else None

    # --- steps ------------------------------------------------------------------------------------

    def _set(self, phase: ReconfigPhase, **fields: object) -> ReconfigStatus:
        assert self.status is not None
        self.status = self.status.model_copy(update={"phase": phase, "updated_at": time.time(), **fields})
        self.last_step_status = self.status
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        return self.status.model_copy()

    def _failed(self, step: str) -> ReconfigStatus:
        return self._set(
            ReconfigPhase.failed,
            error=AgentError(type=INJECTED, message=f"{step} failed on purpose", step=step),
        )

    def _job(self, job_id: str) -> ReconfigStatus:
        if self.status is None or self.status.job_id != job_id:
            raise AgentProblem(self.engine_id, 409, "not-prepared", f"no job {job_id} here")
        return self.status

    def _role(self, request: PrepareRequest) -> Role:
        return request.role_of(self.engine_id) or Role.leaving

    async def _step(
        self, path: str, payload: BaseModel, timeout_s: float | None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        """Every step the client sends (`AgentClient.prepare`, `sync`, ...: the request they build),
        handled at once: at the protocol's path, for the job the request names."""
        operation = OPERATION_AT[path]
        self._check(operation.value, getattr(payload, "job_id", None))
        return self._handlers[operation](payload)

    def _prepare(self, request: PrepareRequest) -> ReconfigStatus:
        busy = self.status is not None and self.status.phase not in TERMINAL_PHASES
        if busy and self.status is not None and self.status.job_id != request.job_id:
            raise AgentProblem(self.engine_id, 409, "job-in-progress", f"{self.status.job_id} is active")
        self.request = request
        self.status = ReconfigStatus(
            job_id=request.job_id,
            generation=request.generation,
            role=self._role(request),
            phase=MOVES[Operation.prepare].running,
            steps_total=1,
            warmup_policy=request.warmup_policy,
            strategy=request.strategy,
            transfer_backend=request.transfer_backend,
            updated_at=time.time(),
        )
        if "fail_prepare" in self.faults:
            return self._failed("prepare")
        if "hang_prepare" in self.faults:
            return self._set(MOVES[Operation.prepare].running, step="transfer")
        return self._set(MOVES[Operation.prepare].done, steps_done=1)

    def _sync(self, job_id: str) -> ReconfigStatus:
        self._job(job_id)
        if "fail_sync" in self.faults:
            return self._failed("sync")
        return self._set(MOVES[Operation.sync].done, synced_value=1 << 20)

    def _pause(self, job_id: str) -> ReconfigStatus:
        self._job(job_id)
        boundary_wait_ms = 0.0
        if self.rank is not None:  # only a serving engine stops serving
            self.paused = True
            self._pause_started = time.time()
            if "slow_boundary" in self.faults:  # stopped a second ago, waiting for its step boundary
                boundary_wait_ms = 1000.0
                self._pause_started -= 1.0
        pause = (
            PauseInterval(paused_at=self._pause_started, boundary_wait_ms=boundary_wait_ms)
            if self._pause_started
            else None
        )
        if "fail_pause" in self.faults:
            return self._failed("pause")
        if "silent_pause" in self.faults:
            return self._set(MOVES[Operation.pause].running, pause=pause)
        return self._set(MOVES[Operation.pause].done, pause=pause)

    def _end_pause(self) -> PauseInterval | None:
        if self._pause_started is None:
            return None
        now = time.time()
        pause = PauseInterval(
            paused_at=self._pause_started, resumed_at=now, pause_ms=(now - self._pause_started) * 1000.0
        )
        self._pause_started = None
        self.paused = False
        return pause

    def _switch(self, job_id: str) -> ReconfigStatus:
        status = self._job(job_id)
        if status.phase in COMMITTING:
            return status.model_copy()
        if "fail_switch" in self.faults:
            pause = self._end_pause()  # back on the generation it still holds
            return self._set(
                ReconfigPhase.failed,
                pause=pause,
                error=AgentError(type=INJECTED, message="switch failed on purpose", step="switch"),
            )
        assert self.request is not None
        members = [m.engine_id for m in self.request.members]
        pause = self._end_pause()
        self.generation = self.request.generation
        self.rank = members.index(self.engine_id) if self.engine_id in members else None
        self.world_size = len(members) if self.rank is not None else 0
        return self._set(MOVES[Operation.switch].done, pause=pause)

    def _arm(self, job_id: str) -> ReconfigStatus:
        """The engine-agreed commit, as one engine sees it when every peer armed: the boundary at
        once, then the switch (a fake has no peers to wait for)."""
        status = self._job(job_id)
        if status.phase in ARMED_ONWARD:
            return status.model_copy()  # a retried arm changes nothing
        if self.rank is not None:
            self.paused = True
            self._pause_started = time.time()
        return self._switch(job_id)

    def _abort(self, job_id: str) -> ReconfigStatus:
        status = self._job(job_id)
        if status.phase in COMMITTING:
            raise AgentProblem(self.engine_id, 409, "already-committed", f"job {job_id} switched")
        abort = MOVES[Operation.abort]
        if status.phase in (abort.running, abort.done):
            return status.model_copy()
        pause = self._end_pause() or status.pause
        return self._set(abort.done, step=None, pause=pause)

    def _resume(self, job_id: str) -> ReconfigStatus:
        self._job(job_id)
        return self._set(MOVES[Operation.resume].done, pause=self._end_pause())

    def ops(self, job_id: str | None = None) -> list[str]:
        """The operations this agent was sent (for `job_id`, if given), reads and polls left out."""
        return [
            op
            for op, job in self.calls
            if op not in ("health", "info", "reconfig", "watch", "cleanup")
            and (job_id is None or job == job_id)
        ]


class FakeFleet(Fleet):
    """A `Fleet` whose clients are the fake agents, by engine id (their URLs are not used)."""

    def __init__(self, agents: dict[str, FakeAgent]) -> None:
        super().__init__(timeout_s=1.0)
        self.agents = agents

    def client(self, engine_id: str, url: str, keys: Sequence[str] | None = None) -> AgentClient:
        return self.agents[engine_id]


class FakeLauncher(Launcher):
    """Starts fake agents (added to the shared `agents`) after `launch_delay_s`; records releases.

    A launch cancelled midway stops what it started, as `Launcher.ensure_engines` requires."""

    name = "fake"

    def __init__(
        self, agents: dict[str, FakeAgent], engine: EngineConfig, *, launch_delay_s: float = 0.0
    ) -> None:
        self.agents = agents
        self.engine = engine
        self.launch_delay_s = launch_delay_s
        self.launching = asyncio.Event()
        self.launch_cancelled = False
        self.started: list[str] = []
        self.released: list[str] = []
        self.capacity: int | None = None  # how many more engines it can start (None: any number)
        self.asked: list[tuple[LaunchSpec, float]] = []  # each launch's spec and deadline
        self.late: dict[str, str] = {}  # what `still_starting` says while a launch runs

    async def ensure_engines(
        self, spec: LaunchSpec, count: int, idle: Sequence[EngineHandle], *, deadline_s: float
    ) -> list[EngineHandle]:
        handles, error = await self.ensure_some(spec, count, idle, deadline_s=deadline_s, strict=True)
        if error is not None:
            raise error
        return handles

    async def ensure_some(
        self,
        spec: LaunchSpec,
        count: int,
        idle: Sequence[EngineHandle],
        *,
        deadline_s: float,
        strict: bool = False,
    ) -> tuple[list[EngineHandle], LaunchError | None]:
        self.asked.append((spec, deadline_s))
        chosen = list(idle[:count])
        missing = count - len(chosen)
        short = self.capacity is not None and missing > self.capacity
        error = LaunchError(f"only {self.capacity} more engines fit") if short else None
        if strict and error is not None:
            return chosen, error
        if self.capacity is not None:
            missing = min(missing, self.capacity)
            self.capacity -= missing
        new_ids = [f"{spec.deployment}-launched-{len(self.started) + i}" for i in range(missing)]
        self.launching.set()
        try:
            await asyncio.sleep(self.launch_delay_s)
        except asyncio.CancelledError:
            self.launch_cancelled = True
            raise
        for index, engine_id in enumerate(new_ids):
            self.agents[engine_id] = FakeAgent(
                engine_id, engine=self.engine, port=21000 + len(self.started) + index
            )
            self.started.append(engine_id)
            chosen.append(EngineHandle(engine_id=engine_id, url=self.agents[engine_id].base_url))
        return chosen, error

    def still_starting(self, deployment: str) -> dict[str, str]:
        return dict(self.late) if self.launching.is_set() else {}

    async def release(self, spec: LaunchSpec, engines: Sequence[EngineHandle]) -> list[str]:
        ids = [e.engine_id for e in engines]
        self.released += ids
        return ids

    async def release_lost(self, engines: Sequence[EngineHandle]) -> None:
        self.released += [e.engine_id for e in engines]
