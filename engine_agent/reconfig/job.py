"""One reconfiguration as this agent sees it (`Job`), the board that publishes its status
(`StatusBoard`), and the agent's parts every stage of the work uses (`Site`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from engine_agent import groups, moe
from engine_agent.protocol import (
    STEPS_COMPLETE,
    EngineConfig,
    Platform,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
    Role,
    WarmupPolicy,
    layer_placements,
)
from engine_agent.reconfig.cleanup import CleanupWorker
from engine_agent.reconfig.steps import ROLES, RoleSteps, Step, StepPlan
from engine_agent.resident import ResidentWeights
from engine_agent.serving import ActiveGeneration, ServingEngine
from engine_agent.step_graphs import StepGraphs
from engine_agent.transfer import WeightChannel

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One reconfiguration: the request, its status and what prepare built."""

    me: str  # this agent's engine id
    request: PrepareRequest
    role: Role
    policy: WarmupPolicy  # effective (fault injection may override it)
    plan: StepPlan
    status: ReconfigStatus
    counted: tuple[Step, ...]  # the steps the status counts now (prepare's, then the window's)
    abort: threading.Event = field(default_factory=threading.Event)
    store: dist.Store | None = None  # the job's prefix of the rendezvous store
    store_client: dist.TCPStore | None = None
    standby: groups.StandbyRegistry = field(default_factory=groups.StandbyRegistry)
    staged: dict[int, torch.Tensor] = field(default_factory=dict)  # flat id -> a row of `stacks`
    stacks: dict[int, moe.ExpertStack] = field(default_factory=dict)  # layer -> the staged stack
    views: list[moe.LayerView] | None = None  # what the engine serves from after the switch (prepare)
    graphs: StepGraphs | None = None  # the new generation's captured step (`Step.capture_graphs`)
    channel: WeightChannel | None = None
    warmed: bool = False
    paused: bool = False  # this job stopped the engine (or it is a joiner inside the window)
    paused_monotonic: float = 0.0
    lease: threading.Timer | None = None
    lease_expired: bool = False
    lease_deadline: float | None = None  # monotonic: when the running pause lease runs out (the fence)
    worker: threading.Thread | None = None
    commit_armed: bool = False  # engine-agreed commit: this engine's loop is armed for the new generation
    at_boundary: bool = False  # engine-agreed commit: the boundary came; no way back but the window's own
    unresponsive: list[str] = field(default_factory=list)  # peers that did not answer inside the window

    @property
    def steps(self) -> RoleSteps:
        """What this engine's role does (the role table in `steps.py`)."""
        return ROLES[self.role]

    @property
    def me_new_rank(self) -> int | None:
        ids = self.new_ids
        return ids.index(self.me) if self.me in ids else None

    @property
    def new_ids(self) -> list[str]:
        return [m.engine_id for m in self.request.members]

    @property
    def old_ids(self) -> list[str]:
        return [m.engine_id for m in self.request.old_members]

    @property
    def participants(self) -> list[str]:
        """Old members in old rank order, then joiners in new rank order: the same list everywhere."""
        old = self.old_ids
        return old + [e for e in self.new_ids if e not in old]

    def new_generation(self, group: groups.CommGroup) -> ActiveGeneration:
        """What this engine serves from after the switch: the new group with what prepare staged (the
        window's switch and the serving thread's armed switch build the same one)."""
        request = self.request
        return ActiveGeneration(
            generation=request.generation,
            group=group,
            members=self.new_ids,
            placements=layer_placements(request.placement, request.placements),
            weights=self.staged,
            member_urls=[m.url for m in request.members],
            member_data=[m.data for m in request.members],
            stacks=self.stacks,
            graphs=self.graphs,
        )

    def longest_step_s(self) -> float:
        """No step outlasts this: every wait in one has one of the job's deadlines."""
        t = self.request.timeouts
        return max(t.rendezvous_s, t.collective_s, t.transfer_s) + 1.0


@dataclass
class ExecutorHooks:
    """Metric hooks (the agent wires Prometheus to them)."""

    on_pause: Callable[[float], None] = lambda pause_ms: None
    on_bytes: Callable[[int], None] = lambda nbytes: None
    # Members of a generation that did not answer inside the commit window (`window_peers`): the agent
    # names them when that generation breaks.
    on_unresponsive: Callable[[int, list[str]], None] = lambda generation, engine_ids: None


class StatusBoard:
    """The job this agent runs (or ran last) and its status. Every change goes through `update`, under
    the one lock of the reconfiguration, and wakes the watchers (the HTTP long-polls)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.job: Job | None = None
        self.unknown_abort: ReconfigStatus | None = None  # abort of a job never prepared here
        self._watchers: set[Callable[[], None]] = set()

    def snapshot(self) -> ReconfigStatus | None:
        with self.lock:
            if self.unknown_abort is not None:
                return self.unknown_abort.model_copy(deep=True)
            return self.job.status.model_copy(deep=True) if self.job else None

    def add_watcher(self, wake: Callable[[], None]) -> None:
        """`wake()` is called on every status change until removed (from the changing thread, under
        the lock: it must be quick)."""
        with self.lock:
            self._watchers.add(wake)

    def remove_watcher(self, wake: Callable[[], None]) -> None:
        with self.lock:
            self._watchers.discard(wake)

    def install(self, job: Job) -> None:
        with self.lock:
            self.job = job
            self.unknown_abort = None
            self._notify()

    def record_unknown_abort(self, status: ReconfigStatus) -> None:
        with self.lock:
            self.unknown_abort = status
            self._notify()

    def update(self, job: Job, **fields: object) -> None:
        """Change the job's status. Once the job is aborting, only the abort writes its phase and
        error: a step that finishes after the abort came must not overwrite the outcome."""
        with self.lock:
            phase = fields.get("phase")
            if job.abort.is_set() and phase not in (None, ReconfigPhase.aborting, ReconfigPhase.aborted):
                fields = {k: v for k, v in fields.items() if k not in ("phase", "error")}
            for key, value in fields.items():
                setattr(job.status, key, value)
            if fields.get("phase") in STEPS_COMPLETE:
                job.status.steps_done = job.status.steps_total
            job.status.updated_at = time.time()
            self._notify()

    def count_steps(self, job: Job, steps: tuple[Step, ...]) -> None:
        """From now on the status counts these steps (the window's, after prepare's)."""
        with self.lock:
            job.counted = steps
            self.update(job, steps_total=len(steps), steps_done=0)

    def _notify(self) -> None:
        for wake in list(self._watchers):
            try:
                wake()
            except Exception:  # a watcher whose loop is gone must not break the executor
                log.debug("a status watcher failed", exc_info=True)


@dataclass(frozen=True)
class Site:
    """This agent's parts that a job works with."""

    engine_id: str
    engine: ServingEngine
    config: EngineConfig
    platform: Platform
    device: torch.device
    cleanup: CleanupWorker
    hooks: ExecutorHooks
    board: StatusBoard
    data_host: str = "127.0.0.1"  # where this engine's groups and weight channel bind (its data address)
    resident: ResidentWeights = field(default_factory=ResidentWeights)  # a broken generation's rows
