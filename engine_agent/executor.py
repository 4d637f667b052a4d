"""The reconfiguration executor: prepare, sync, pause, switch, resume, abort, for one job at a time.

Every operation answers at once (the HTTP layer returns 202) and runs in a background thread; progress
and outcome are in `ReconfigStatus`. See `protocol.py` for the flow the coordinator drives:

    background: prepare -> sync -> pause -> switch     blocking: prepare -> pause -> sync -> switch

prepare (background strategy, while the old generation serves):
    wait for pending cleanup (refuse over an unresolved failure) -> connect to the job's store ->
    agree on warm-up policy and generation through the store (before any collective on a new group)
    -> create the standby EP group (new members) -> stage the new placement (slot buffers) -> open the
    weight channel over old + new participants -> move weights (peers, local copies, checkpoint) ->
    eager warm-up.
pause: stop at the agreed step boundary, deferred warm-up in the window (blocking strategy: all of
    prepare's work here), then a pause lease: no switch/resume within it -> resume the old generation.
switch: swap groups + placement + weights together and serve; leavers go idle; the retired group goes
    to the cleanup worker.
A failure before switch destroys standby groups and staged weights and leaves (or puts) the old
generation serving.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from engine_agent import groups, moe
from engine_agent.cleanup import CleanupWorker, RetiredGeneration
from engine_agent.engine import ActiveGeneration, PausedAt, ServingEngine
from engine_agent.placement import plan_transfers, validate_placement
from engine_agent.protocol import (
    TERMINAL_PHASES,
    AgentError,
    AgentState,
    EngineConfig,
    FaultInjection,
    LeavePolicy,
    PauseInterval,
    Platform,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
    Role,
    Strategy,
    WarmupPolicy,
)
from engine_agent.transfer import (
    TransferError,
    TransferTimeout,
    WeightChannel,
    available_backends,
    open_channel,
)

log = logging.getLogger(__name__)

AGREE_POLL_S = 0.02


class ReconfigError(Exception):
    """A reconfiguration step failed; `type` is the machine-readable AgentError type."""

    def __init__(self, type_: str, message: str, engines: list[str] | None = None) -> None:
        super().__init__(message)
        self.type = type_
        self.engines = engines or []


class Conflict(Exception):
    """The call does not fit the current job or phase (HTTP 409)."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(message)
        self.type = type_


class InvalidRequest(Exception):
    """The request cannot be carried out as given (HTTP 422)."""


class _Aborted(Exception):
    pass


@dataclass
class ExecutorHooks:
    """Metric hooks (the API wires Prometheus to them)."""

    on_pause: Callable[[float], None] = lambda pause_ms: None
    on_bytes: Callable[[int], None] = lambda nbytes: None


@dataclass
class _Job:
    """One reconfiguration as this agent sees it: the request, its status and what prepare built."""

    me: str  # this agent's engine id
    request: PrepareRequest
    role: Role
    policy: WarmupPolicy  # effective (fault injection may override it)
    status: ReconfigStatus
    steps: list[str]
    abort: threading.Event = field(default_factory=threading.Event)
    store: dist.Store | None = None  # the job's prefix of the rendezvous store
    store_client: dist.TCPStore | None = None
    standby: groups.StandbyRegistry = field(default_factory=groups.StandbyRegistry)
    staged: dict[int, torch.Tensor] = field(default_factory=dict)
    channel: WeightChannel | None = None
    warmed: bool = False
    paused: bool = False  # this job stopped the engine (or it is a joiner inside the window)
    paused_monotonic: float = 0.0
    lease: threading.Timer | None = None
    lease_expired: bool = False
    worker: threading.Thread | None = None

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

    @property
    def in_new(self) -> bool:
        return self.role in (Role.joining, Role.staying)

    @property
    def in_old(self) -> bool:
        return self.role in (Role.staying, Role.leaving)


class ReconfigExecutor:
    def __init__(
        self,
        *,
        engine_id: str,
        engine: ServingEngine,
        config: EngineConfig,
        platform: Platform,
        device: torch.device,
        cleanup: CleanupWorker,
        hooks: ExecutorHooks | None = None,
        default_pause_lease_s: float = 10.0,
    ) -> None:
        self.engine_id = engine_id
        self.engine = engine
        self.config = config
        self.platform = platform
        self.device = device
        self.cleanup = cleanup
        self.hooks = hooks or ExecutorHooks()
        self.default_pause_lease_s = default_pause_lease_s
        self.faults = FaultInjection()
        self._lock = threading.RLock()
        self._job: _Job | None = None
        self._peer_pause_lease: threading.Timer | None = None
        self._hang_released = threading.Event()
        self._unknown_abort: ReconfigStatus | None = None  # abort of a job never prepared here
        # Called (under the lock, so they must be quick) on every status change: long-polls wake on it.
        self._watchers: set[Callable[[], None]] = set()

    # ---- queries ---------------------------------------------------------------------------------

    def status(self) -> ReconfigStatus | None:
        with self._lock:
            if self._unknown_abort is not None:
                return self._unknown_abort.model_copy(deep=True)
            return self._job.status.model_copy(deep=True) if self._job else None

    def add_watcher(self, wake: Callable[[], None]) -> None:
        """`wake()` is called on every status change until removed (from the changing thread)."""
        with self._lock:
            self._watchers.add(wake)

    def remove_watcher(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._watchers.discard(wake)

    def _notify(self) -> None:
        with self._lock:
            for wake in list(self._watchers):
                try:
                    wake()
                except Exception:  # a watcher whose loop is gone must not break the executor
                    log.debug("a status watcher failed", exc_info=True)

    def inject(self, faults: FaultInjection) -> None:
        with self._lock:
            if faults.release_hang:
                self._hang_released.set()
            self.faults = faults.model_copy(update={"release_hang": False})
        if faults.fail_next_cleanup:
            self.cleanup.fail_next()

    # ---- the operations (each returns at once) ---------------------------------------------------

    def prepare(self, request: PrepareRequest) -> ReconfigStatus:
        with self._lock:
            current = self._job
            if self._unknown_abort is not None and self._unknown_abort.job_id == request.job_id:
                raise Conflict("job_aborted", f"job {request.job_id} was aborted here before its prepare")
            if current is not None and current.request.job_id == request.job_id:
                return current.status.model_copy(deep=True)  # a retried POST: same job
            if current is not None and current.status.phase not in TERMINAL_PHASES:
                raise Conflict(
                    "job_in_progress",
                    f"job {current.request.job_id} is {current.status.phase}; abort it first",
                )
            role = self._validate(request)
            policy = self.faults.warmup_policy_override or request.warmup_policy
            steps = self._prepare_steps(request.strategy, role, policy, blocking_window=False)
            job = _Job(
                me=self.engine_id,
                request=request,
                role=role,
                policy=policy,
                status=ReconfigStatus(
                    job_id=request.job_id,
                    generation=request.generation,
                    role=role,
                    phase=ReconfigPhase.preparing,
                    steps_total=len(steps),
                    warmup_policy=policy,
                    strategy=request.strategy,
                    transfer_backend=request.transfer_backend,
                    updated_at=time.time(),
                ),
                steps=steps,
            )
            self._job = job
            self._unknown_abort = None
            self._notify()
            if role == Role.leaving and request.leave_policy == LeavePolicy.finish:
                # Stop admitting now; the pause then waits for the queue to drain.
                self.engine.set_admitting(False)
                self.engine.set_drain_before_pause(True)
            self._start(job, self._run_prepare, "prepare")
            return job.status.model_copy(deep=True)

    def sync(self, job_id: str) -> ReconfigStatus:
        with self._lock:
            job = self._job_for(job_id)
            phase = job.status.phase
            if phase in (ReconfigPhase.syncing, ReconfigPhase.synced):
                return job.status.model_copy(deep=True)
            ready = (
                ReconfigPhase.paused if job.request.strategy == Strategy.blocking else ReconfigPhase.prepared
            )
            if phase != ready:
                raise Conflict(
                    "wrong_phase", f"sync needs phase {ready} ({job.request.strategy}), job is {phase}"
                )
            self._set(job, phase=ReconfigPhase.syncing, step="sync")
            self._start(job, self._run_sync, "sync")
            return job.status.model_copy(deep=True)

    def pause(self, job_id: str, lease_s: float | None) -> ReconfigStatus:
        with self._lock:
            job = self._job_for(job_id)
            phase = job.status.phase
            if phase in (ReconfigPhase.pausing, ReconfigPhase.paused):
                return job.status.model_copy(deep=True)
            allowed = (
                {ReconfigPhase.prepared}
                if job.request.strategy == Strategy.blocking
                else {ReconfigPhase.prepared, ReconfigPhase.synced}
            )
            if phase not in allowed:
                raise Conflict("wrong_phase", f"pause needs phase {sorted(allowed)}, job is {phase}")
            self._set(job, phase=ReconfigPhase.pausing, step="pause")
            lease = lease_s or job.request.timeouts.pause_lease_s
            self._start(job, lambda j: self._run_pause(j, lease), "pause")
            return job.status.model_copy(deep=True)

    def switch(self, job_id: str) -> ReconfigStatus:
        with self._lock:
            job = self._job_for(job_id)
            phase = job.status.phase
            if phase in (ReconfigPhase.switching, ReconfigPhase.committed):
                return job.status.model_copy(deep=True)
            if job.lease_expired:
                raise Conflict(
                    "pause_lease_expired",
                    f"job {job_id}: the pause lease ran out and this engine resumed generation "
                    f"{job.request.old_generation}; switch refused",
                )
            in_window = phase == ReconfigPhase.paused or (
                phase == ReconfigPhase.synced and job.request.strategy == Strategy.blocking
            )
            if not in_window or not job.paused:
                raise Conflict("wrong_phase", f"switch needs a paused engine, job is {phase}")
            self._cancel_lease(job)
            self._set(job, phase=ReconfigPhase.switching, step="switch")
            self._start(job, self._run_switch, "switch")
            return job.status.model_copy(deep=True)

    def resume(self, job_id: str) -> ReconfigStatus:
        with self._lock:
            job = self._job_for(job_id)
            phase = job.status.phase
            if phase in (ReconfigPhase.resuming, ReconfigPhase.resumed):
                return job.status.model_copy(deep=True)
            if phase in (ReconfigPhase.switching, ReconfigPhase.committed):
                raise Conflict(
                    "already_committed", f"job {job_id} switched; there is no old generation to resume"
                )
            if not job.paused:
                raise Conflict("wrong_phase", f"resume needs a paused engine, job is {phase}")
            self._cancel_lease(job)
            self._set(job, phase=ReconfigPhase.resuming, step="resume")
            self._start(job, self._run_resume, "resume")
            return job.status.model_copy(deep=True)

    def abort(self, job_id: str) -> ReconfigStatus:
        with self._lock:
            job = self._job
            if self._unknown_abort is not None and self._unknown_abort.job_id == job_id:
                return self._unknown_abort.model_copy(deep=True)
            if job is None or job.request.job_id != job_id:
                if job is not None and job.status.phase not in TERMINAL_PHASES:
                    raise Conflict(
                        "job_in_progress", f"job {job.request.job_id} is active here, not {job_id}"
                    )
                return self._record_unknown_abort(job_id)
            phase = job.status.phase
            if phase in (ReconfigPhase.aborting, ReconfigPhase.aborted):
                return job.status.model_copy(deep=True)
            if phase in (ReconfigPhase.switching, ReconfigPhase.committed):
                raise Conflict("already_committed", f"job {job_id} switched; abort is too late")
            job.abort.set()
            self._cancel_lease(job)
            previous_error = job.status.error
            self._set(job, phase=ReconfigPhase.aborting, step="abort")
            worker = job.worker
        threading.Thread(
            target=self._run_abort, args=(job, worker, previous_error), name="abort", daemon=True
        ).start()
        return self.status() or job.status

    def on_engine_paused(self, paused: PausedAt) -> None:
        """The serving loop stopped at a boundary. When a peer's pause stopped us before our own pause
        request came, the pause lease starts now all the same: we never stay stopped forever."""
        if not paused.by_peer:
            return
        with self._lock:
            job = self._job
            lease_s = job.request.timeouts.pause_lease_s if job else self.default_pause_lease_s
            if self._peer_pause_lease is not None:
                self._peer_pause_lease.cancel()
            timer = threading.Timer(lease_s, self._peer_pause_expired, args=(job,))
            timer.daemon = True
            self._peer_pause_lease = timer
            timer.start()

    # ---- background bodies -----------------------------------------------------------------------

    def _run_prepare(self, job: _Job) -> None:
        self._step(job, "wait_cleanup")
        if not self.cleanup.wait_idle(job.request.timeouts.collective_s):
            raise ReconfigError("cleanup_pending", "cleanup of a retired generation is still running")
        failure = self.cleanup.unresolved_failure()
        if failure is not None:
            raise ReconfigError(
                "cleanup_failed",
                f"unresolved cleanup failure of job {failure.job_id} (generation {failure.generation}): "
                f"{failure.error}; POST /v1/cleanup/retry or /v1/cleanup/acknowledge first",
            )
        if job.request.strategy == Strategy.background:
            self._prepare_work(job)
        self._set(job, phase=ReconfigPhase.prepared, step=None)

    def _prepare_work(self, job: _Job) -> None:
        """Everything that builds the new generation (in prepare, or inside the window if blocking)."""
        request = job.request
        self._step(job, "connect_store")
        try:
            job.store_client = groups.connect_store(request.store, request.timeouts.rendezvous_s)
        except (RuntimeError, OSError) as exc:  # DistStoreError is a RuntimeError
            where = f"{request.store.host}:{request.store.port}"
            raise ReconfigError("store_unreachable", f"rendezvous store {where}: {exc}") from exc
        job.store = groups.prefixed(
            job.store_client, groups.generation_prefix(request.generation, request.job_id)
        )
        self._step(job, "agree")
        self._agree(job)
        if job.in_new:
            self._step(job, "create_groups")
            rank = job.me_new_rank
            assert rank is not None
            job.standby.add(
                groups.create_group(
                    name="ep",
                    generation=request.generation,
                    store=groups.prefixed(job.store, "ep/"),
                    rank=rank,
                    size=len(request.members),
                    platform=self.platform,
                    device=self.device,
                    timeout_s=request.timeouts.collective_s,
                )
            )
            self._step(job, "stage_placement")
            expert_bytes = moe.expert_nbytes(self.config)
            for expert in sorted(set(request.placement[rank])):
                job.staged[expert] = torch.empty(
                    moe.expert_numel(self.config), dtype=moe.torch_dtype(self.config), device=self.device
                )
            self._set(job, bytes_total=len(job.staged) * expert_bytes)
        self._step(job, "open_channel")
        if request.transfer_backend not in available_backends():
            raise ReconfigError(
                "transfer_backend_unavailable",
                f"transfer backend {request.transfer_backend} is not available here",
            )
        job.channel = open_channel(
            request.transfer_backend,
            engine_id=self.engine_id,
            participants=job.participants,
            store=groups.prefixed(job.store, "xfer/"),
            device=self.device,
            timeout_s=request.timeouts.transfer_s,
        )
        self._step(job, "transfer")
        self._transfer(job)
        if job.in_new and job.policy == WarmupPolicy.eager and request.strategy == Strategy.background:
            self._step(job, "warm_up")
            self._warm_up(job)

    def _agree(self, job: _Job) -> None:
        """Before the first collective on a new group: every participant publishes its warm-up policy
        and generation, and all must match. A mismatch fails at once, naming the disagreeing engines;
        absent participants fail at the rendezvous deadline."""
        request = job.request
        store = job.store
        assert store is not None
        mine = {"engine_id": self.engine_id, "policy": str(job.policy), "generation": request.generation}
        store.set(f"agree/{self.engine_id}", json.dumps(mine))
        deadline = time.monotonic() + request.timeouts.rendezvous_s
        seen: dict[str, dict[str, object]] = {}
        while True:
            for engine in job.participants:
                if engine not in seen and store.check([f"agree/{engine}"]):
                    seen[engine] = json.loads(store.get(f"agree/{engine}"))
            disagreeing = sorted(
                engine
                for engine, value in seen.items()
                if value["policy"] != str(request.warmup_policy) or value["generation"] != request.generation
            )
            if disagreeing:
                held = ", ".join(f"{e}={seen[e]['policy']}@gen{seen[e]['generation']}" for e in sorted(seen))
                raise ReconfigError(
                    "policy_mismatch",
                    f"warm-up policy/generation disagreement for job {request.job_id}: the job says "
                    f"{request.warmup_policy}@gen{request.generation}; engines {', '.join(disagreeing)} "
                    f"disagree ({held})",
                    engines=disagreeing,
                )
            missing = [e for e in job.participants if e not in seen]
            if not missing:
                return
            if job.abort.is_set():
                raise _Aborted()
            if time.monotonic() > deadline:
                raise ReconfigError(
                    "rendezvous_timeout",
                    f"no word from {', '.join(missing)} within {request.timeouts.rendezvous_s:g} s",
                    engines=missing,
                )
            time.sleep(AGREE_POLL_S)

    def _transfer(self, job: _Job) -> None:
        """Fill the staged buffers: local copies for experts held already, the checkpoint (recompute from
        the seed) for experts no old engine holds, the weight channel for the rest."""
        request = job.request
        if job.in_old:
            self._check_old_placement(job)
        held = dict(self.engine.active.weights) if job.in_old and self.engine.active else {}
        plan = plan_transfers(job.old_ids, request.old_placement, job.new_ids, request.placement)
        expert_bytes = moe.expert_nbytes(self.config)
        moved = 0

        def progress(nbytes: int) -> None:
            self.hooks.on_bytes(nbytes)
            self._set(job, bytes_moved=job.status.bytes_moved + nbytes)

        remote = {item.logical_expert for item in plan if item.dst == self.engine_id and item.src is not None}
        for expert, buffer in job.staged.items():
            if expert in remote:
                continue
            if expert in held:
                buffer.copy_(held[expert])
            else:
                buffer.copy_(moe.expert_weights(self.config, expert, self.device))
            moved += expert_bytes
            progress(expert_bytes)
        assert job.channel is not None
        received_so_far = 0

        def on_channel_progress(received: int) -> None:
            nonlocal received_so_far
            progress(received - received_so_far)
            received_so_far = received

        stats = job.channel.transfer(
            plan,
            sources=held,
            destinations={e: job.staged[e] for e in remote},
            on_progress=on_channel_progress,
        )
        if stats.bytes_received > received_so_far:
            progress(stats.bytes_received - received_so_far)
        # Nobody tears its end down while a peer may still be connecting to it or reading from it.
        self._barrier(job, "xfer_done", job.participants, job.request.timeouts.transfer_s)
        job.channel.close()
        job.channel = None
        log.info(
            "job %s: staged %d experts (%d bytes local/checkpoint, %d received, %d sent) via %s in %.3f s",
            request.job_id,
            len(job.staged),
            moved,
            stats.bytes_received,
            stats.bytes_sent,
            stats.backend,
            stats.seconds,
        )

    def _barrier(self, job: _Job, name: str, engines: list[str], timeout_s: float) -> None:
        store = job.store
        assert store is not None
        store.set(f"{name}/{self.engine_id}", "1")
        deadline = time.monotonic() + timeout_s
        while True:
            missing = [e for e in engines if not store.check([f"{name}/{e}"])]
            if not missing:
                return
            if job.abort.is_set():
                raise _Aborted()
            if time.monotonic() > deadline:
                waited = f"{name}: no word from {', '.join(missing)} within {timeout_s:g} s"
                raise ReconfigError("rendezvous_timeout", waited, missing)
            time.sleep(AGREE_POLL_S)

    def _check_old_placement(self, job: _Job) -> None:
        active = self.engine.active
        old_rank = job.old_ids.index(self.engine_id)
        if active is None or set(active.weights) != set(job.request.old_placement[old_rank]):
            raise ReconfigError(
                "placement_mismatch",
                f"old_placement[{old_rank}] does not match what {self.engine_id} holds "
                f"({sorted(active.weights) if active else 'nothing'})",
            )

    def _warm_up(self, job: _Job) -> float:
        group = job.standby.get("ep")
        assert group is not None
        started = time.monotonic()
        groups.warm_up(group)
        job.warmed = True
        return (time.monotonic() - started) * 1000.0

    def _run_sync(self, job: _Job) -> None:
        """Agree on the smallest free KV-cache memory over the new group. With a deferred policy and an
        unwarmed group the values go through the store: no collective on a new group before the window."""
        if not job.in_new:
            self._set(job, phase=ReconfigPhase.synced, step=None)
            return
        value = self.engine.free_kv_bytes()
        group = job.standby.get("ep")
        assert group is not None
        if job.warmed:
            tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
            synced = int(group.allreduce(tensor, dist.ReduceOp.MIN).item())
        else:
            synced = self._min_through_store(job, value)
        self._set(job, phase=ReconfigPhase.synced, step=None, synced_value=synced)

    def _min_through_store(self, job: _Job, value: int) -> int:
        store = job.store
        assert store is not None
        store.set(f"sync/{self.engine_id}", str(value))
        keys = [f"sync/{e}" for e in job.new_ids]
        try:
            store.wait(keys, timedelta(seconds=job.request.timeouts.collective_s))
        except Exception as exc:
            missing = [e for e in job.new_ids if not store.check([f"sync/{e}"])]
            raise ReconfigError(
                "sync_timeout", f"no sync value from {', '.join(missing)}: {exc}", missing
            ) from exc
        return min(int(store.get(k)) for k in keys)

    def _run_pause(self, job: _Job, lease_s: float) -> None:
        request = job.request
        if job.in_old:
            paused = self.engine.pause(request.timeouts.collective_s)
            self._cancel_peer_lease()
            interval = PauseInterval(paused_at=paused.wall, boundary_wait_ms=paused.boundary_wait_ms)
            job.paused_monotonic = paused.monotonic
        else:  # a joiner served nothing: it is never down, so it reports no pause interval
            interval = PauseInterval(paused_at=time.time())
            job.paused_monotonic = time.monotonic()
        job.paused = True
        reported = interval if job.in_old else None
        self._set(job, pause=reported)
        if request.strategy == Strategy.blocking:
            job.steps = self._prepare_steps(request.strategy, job.role, job.policy, blocking_window=True)
            self._set(job, steps_total=len(job.steps), steps_done=0)
            started = time.monotonic()
            self._prepare_work(job)
            interval.blocking_prepare_ms = (time.monotonic() - started) * 1000.0
        if job.in_new and not job.warmed:
            self._step(job, "warm_up")
            interval.warmup_ms = self._warm_up(job)
        with self._lock:
            if job.abort.is_set():
                raise _Aborted()
            # The lease first: starting its timer thread can take a while on a busy host, and the
            # long-polls woken by `paused` need this lock to answer (this is inside the window).
            self._start_lease(job, lease_s)
            self._set(job, phase=ReconfigPhase.paused, step=None, pause=reported)

    def _run_switch(self, job: _Job) -> None:
        request = job.request
        with self._lock:
            inject = self.faults.fail_next_switch
            if inject:
                self.faults = self.faults.model_copy(update={"fail_next_switch": False})
        if inject:
            raise ReconfigError("injected_failure", "switch failed (fault injection)")
        started = time.monotonic()
        retired: ActiveGeneration | None
        if job.in_new:
            standby = job.standby.take_all()
            new = ActiveGeneration(
                generation=request.generation,
                group=standby["ep"],
                members=job.new_ids,
                placement=request.placement,
                weights=job.staged,
            )
            retired = self.engine.switch(new)
            job.staged = {}
        else:
            retired = self.engine.leave(fail_queued=request.leave_policy == LeavePolicy.abort)
        switch_ms = (time.monotonic() - started) * 1000.0
        if retired is not None:
            self.cleanup.submit(RetiredGeneration(request.job_id, retired.generation, [retired.group]))
        resume_started = time.monotonic()
        if job.in_new and not self.engine.wait_serving(request.timeouts.collective_s):
            log.warning(
                "job %s: generation %s not serving within the collective deadline",
                request.job_id,
                request.generation,
            )
        self._finish_window(job, switch_ms=switch_ms, resume_started=resume_started)
        self._set(job, phase=ReconfigPhase.committed, step=None)

    def _run_resume(self, job: _Job) -> None:
        resume_started = time.monotonic()
        self._back_to_old_generation(job)
        self._finish_window(job, switch_ms=0.0, resume_started=resume_started)
        self._set(job, phase=ReconfigPhase.resumed, step=None)

    def _run_abort(
        self, job: _Job, worker: threading.Thread | None, previous_error: AgentError | None
    ) -> None:
        if job.in_old and job.status.pause is None:
            self.engine.resume()  # withdraw a pause request still waiting for its step boundary
        if worker is not None and worker is not threading.current_thread():
            # The running step ends at its own deadline at the latest (every wait has one).
            worker.join(timeout=self._longest_step_s(job))
        resume_started = time.monotonic()
        was_paused = job.paused
        self._back_to_old_generation(job)
        if was_paused:
            self._finish_window(job, switch_ms=0.0, resume_started=resume_started)
        self._set(job, phase=ReconfigPhase.aborted, step=None, error=previous_error)

    # ---- helpers ---------------------------------------------------------------------------------

    def _back_to_old_generation(self, job: _Job) -> None:
        """Drop everything staged and serve the old generation (never raises)."""
        if job.channel is not None:
            try:
                job.channel.close()
            except Exception:
                log.warning("closing the weight channel failed", exc_info=True)
            job.channel = None
        for error in job.standby.destroy_all():
            log.warning("destroying a standby group failed: %s", error)
        job.staged = {}
        if job.in_old:
            self.engine.set_drain_before_pause(False)
            self.engine.set_admitting(True)
            # Paused by this job or by a peer's pause for it: either way the old generation serves
            # again, or the members that resumed would wait on this one in their next step.
            self._cancel_peer_lease()
            if self.engine.state == AgentState.paused:
                self.engine.resume()
        job.paused = False

    def _finish_window(self, job: _Job, *, switch_ms: float, resume_started: float) -> None:
        interval = job.status.pause
        if interval is None:
            return
        now = time.monotonic()
        interval.switch_ms = switch_ms
        interval.resume_ms = (now - resume_started) * 1000.0
        interval.pause_ms = (now - job.paused_monotonic) * 1000.0
        interval.resumed_at = interval.paused_at + interval.pause_ms / 1000.0
        if job.in_old:
            self.hooks.on_pause(interval.pause_ms)
        self._set(job, pause=interval)

    def _start_lease(self, job: _Job, lease_s: float) -> None:
        timer = threading.Timer(lease_s, self._lease_expired, args=(job,))
        timer.daemon = True
        job.lease = timer
        timer.start()

    def _cancel_lease(self, job: _Job) -> None:
        if job.lease is not None:
            job.lease.cancel()
            job.lease = None
        self._cancel_peer_lease()

    def _cancel_peer_lease(self) -> None:
        with self._lock:
            if self._peer_pause_lease is not None:
                self._peer_pause_lease.cancel()
                self._peer_pause_lease = None

    def _lease_expired(self, job: _Job) -> None:
        with self._lock:
            if self._job is not job or not job.paused or job.lease is None:
                return
            job.lease = None
            job.lease_expired = True
            lease_error = AgentError(
                type="pause_lease_expired",
                message="no switch or resume within the pause lease; resumed generation "
                f"{job.request.old_generation}",
                step="pause",
            )
        log.warning("job %s: pause lease expired, resuming the old generation", job.request.job_id)
        resume_started = time.monotonic()
        self._back_to_old_generation(job)
        self._finish_window(job, switch_ms=0.0, resume_started=resume_started)
        self._set(job, phase=ReconfigPhase.failed, step=None, error=lease_error)

    def _peer_pause_expired(self, job: _Job | None) -> None:
        """Stopped by a peer, and no pause/switch/resume of our own followed within the lease."""
        with self._lock:
            self._peer_pause_lease = None
            if self.engine.state != AgentState.paused or (job is not None and job.paused):
                return
        log.warning("stopped by a peer's pause and heard nothing within the lease: resuming")
        if job is not None and job.status.phase not in TERMINAL_PHASES:
            job.lease_expired = True
            self._set(
                job,
                phase=ReconfigPhase.failed,
                error=AgentError(
                    type="pause_lease_expired", message="stopped by a peer's pause; lease ran out"
                ),
            )
            job.abort.set()  # after the outcome is written: a step still running must not overwrite it
            self._back_to_old_generation(job)
        self.engine.resume()

    def _start(self, job: _Job, body: Callable[[_Job], None], name: str) -> None:
        def run() -> None:
            try:
                body(job)
            except _Aborted:
                pass  # the abort thread owns the outcome
            except Exception as exc:
                self._fail(job, exc)

        thread = threading.Thread(target=run, name=f"reconfig-{name}", daemon=True)
        job.worker = thread
        thread.start()

    def _fail(self, job: _Job, exc: Exception) -> None:
        if job.abort.is_set():
            return  # aborting: the abort thread owns the outcome
        if isinstance(exc, ReconfigError):
            error = AgentError(type=exc.type, message=str(exc), step=job.status.step, engines=exc.engines)
        elif isinstance(exc, groups.GroupRendezvousTimeout):
            error = AgentError(type="rendezvous_timeout", message=str(exc), step=job.status.step)
        elif isinstance(exc, groups.CollectiveTimeout):
            error = AgentError(type="collective_timeout", message=str(exc), step=job.status.step)
        elif isinstance(exc, TransferTimeout):
            error = AgentError(type="transfer_timeout", message=str(exc), step=job.status.step)
        elif isinstance(exc, TransferError):
            error = AgentError(type="transfer_failed", message=str(exc), step=job.status.step)
        else:
            error = AgentError(type=type(exc).__name__, message=str(exc), step=job.status.step)
        log.warning("job %s failed at %s: %s", job.request.job_id, job.status.step, error.message)
        if job.status.phase == ReconfigPhase.switching:
            # Still paused on the old generation: the coordinator resumes or aborts, or the lease does.
            with self._lock:
                self._set(job, phase=ReconfigPhase.failed, error=error)
                self._start_lease(job, job.request.timeouts.pause_lease_s)
            return
        resume_started = time.monotonic()
        was_paused = job.paused
        self._back_to_old_generation(job)
        if was_paused:
            self._finish_window(job, switch_ms=0.0, resume_started=resume_started)
        self._set(job, phase=ReconfigPhase.failed, error=error)

    def _step(self, job: _Job, name: str) -> None:
        """Enter a named step: progress, abort check, and the test-only fault switches."""
        if job.abort.is_set():
            raise _Aborted()
        with self._lock:
            done = job.steps.index(name) if name in job.steps else job.status.steps_done
            self._set(job, step=name, steps_done=done)
            fail_at, hang_at = self.faults.fail_prepare_at_step, self.faults.hang_prepare_at_step
            if fail_at == name:
                self.faults = self.faults.model_copy(update={"fail_prepare_at_step": None})
            if hang_at == name:
                self.faults = self.faults.model_copy(update={"hang_prepare_at_step": None})
                self._hang_released.clear()
        if fail_at == name:
            raise ReconfigError("injected_failure", f"prepare failed at step {name} (fault injection)")
        if hang_at == name:
            while not job.abort.wait(0.02):
                if self._hang_released.is_set():
                    return
            raise _Aborted()

    def _set(self, job: _Job, **fields: object) -> None:
        with self._lock:
            phase = fields.get("phase")
            if (
                job.abort.is_set()
                and phase is not None
                and phase
                not in (
                    ReconfigPhase.aborting,
                    ReconfigPhase.aborted,
                )
            ):
                # A step that finished after the abort came: the abort owns the outcome.
                fields = {k: v for k, v in fields.items() if k not in ("phase", "error")}
            for key, value in fields.items():
                setattr(job.status, key, value)
            if fields.get("phase") in (ReconfigPhase.prepared, ReconfigPhase.synced, ReconfigPhase.committed):
                job.status.steps_done = job.status.steps_total
            job.status.updated_at = time.time()
            self._notify()

    def _job_for(self, job_id: str) -> _Job:
        job = self._job
        if job is None:
            raise Conflict("no_job", f"no reconfiguration here; prepare job {job_id} first")
        if job.request.job_id != job_id:
            raise Conflict("wrong_job", f"job {job_id} is not the job here ({job.request.job_id})")
        return job

    def _record_unknown_abort(self, job_id: str) -> ReconfigStatus:
        """Abort of a job this agent never prepared (its prepare was lost or never sent): nothing to
        undo; `GET /v1/reconfig` reports it aborted so the coordinator's poll ends."""
        active = self.engine.active
        status = ReconfigStatus(
            job_id=job_id,
            generation=active.generation if active else 0,
            role=Role.staying if active else Role.joining,
            phase=ReconfigPhase.aborted,
            warmup_policy=WarmupPolicy.eager,
            strategy=Strategy.background,
            updated_at=time.time(),
        )
        self._unknown_abort = status
        self._notify()
        return status.model_copy(deep=True)

    def _validate(self, request: PrepareRequest) -> Role:
        me = self.engine_id
        new_ids = [m.engine_id for m in request.members]
        old_ids = [m.engine_id for m in request.old_members]
        if me in new_ids and me in old_ids:
            role = Role.staying
        elif me in new_ids:
            role = Role.joining
        elif me in old_ids:
            role = Role.leaving
        else:
            raise Conflict("not_a_participant", f"{me} is neither in members nor in old_members")
        try:
            validate_placement(request.placement, self.config.num_logical_experts)
            if len(request.placement) != len(new_ids):
                raise ValueError(f"placement has {len(request.placement)} ranks for {len(new_ids)} members")
            if len(request.old_placement) != len(old_ids):
                raise ValueError(
                    f"old_placement has {len(request.old_placement)} ranks for {len(old_ids)} members"
                )
            if old_ids:
                validate_placement(request.old_placement, self.config.num_logical_experts)
        except ValueError as exc:
            raise InvalidRequest(f"invalid placement: {exc}") from exc
        active = self.engine.active
        if role == Role.joining and active is not None:
            raise Conflict(
                "generation_mismatch", f"{me} serves generation {active.generation}; it cannot join as new"
            )
        if role != Role.joining:
            if active is None or active.generation != request.old_generation:
                held = active.generation if active else "none"
                raise Conflict(
                    "generation_mismatch",
                    f"{me} serves generation {held}, the job's old generation is {request.old_generation}",
                )
            if old_ids.index(me) != active.rank:
                raise Conflict("generation_mismatch", f"{me} is rank {active.rank}, not {old_ids.index(me)}")
        if request.generation <= request.old_generation:
            raise InvalidRequest("generation must be greater than old_generation")
        return role

    @staticmethod
    def _prepare_steps(
        strategy: Strategy, role: Role, policy: WarmupPolicy, *, blocking_window: bool
    ) -> list[str]:
        if strategy == Strategy.blocking and not blocking_window:
            return ["wait_cleanup"]
        steps = [] if blocking_window else ["wait_cleanup"]  # the window's steps: cleanup was awaited
        steps += ["connect_store", "agree"]
        if role != Role.leaving:
            steps += ["create_groups", "stage_placement"]
        steps += ["open_channel", "transfer"]
        if role != Role.leaving and (policy == WarmupPolicy.eager or blocking_window):
            steps.append("warm_up")  # blocking: inside the window whatever the policy
        return steps

    @staticmethod
    def _longest_step_s(job: _Job) -> float:
        t = job.request.timeouts
        return max(t.rendezvous_s, t.collective_s, t.transfer_s) + 1.0

    def shutdown(self) -> None:
        with self._lock:
            job = self._job
        if job is not None and job.status.phase not in TERMINAL_PHASES:
            job.abort.set()
            self._cancel_lease(job)
            self._back_to_old_generation(job)
