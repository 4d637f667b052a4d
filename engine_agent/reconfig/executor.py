"""The reconfiguration executor: prepare, sync, pause, switch, resume, abort, for one job at a time.

Each operation checks the call against the job's phase (the protocol's `ACCEPTS`), answers with the status at
once and runs its work in a background thread; the HTTP layer may then hold its answer until the
operation's end phase (the bounded long-poll). The work itself is in `prepare.py` (the steps that
build the new generation, and sync) and `window.py` (pause, switch, resume, the leases), driven by the
role and strategy tables of `steps.py`.

A failure before the switch destroys standby groups and staged weights and leaves (or puts) the old
generation serving. A failure during the switch leaves the engine paused on the old generation under a
pause lease: the coordinator resumes or aborts it, or the lease does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from engine_agent.protocol import (
    ACCEPTS,
    ARMED_ONWARD,
    COMMITTING,
    MOVES,
    TERMINAL_PHASES,
    AgentError,
    EngineConfig,
    FaultInjection,
    Operation,
    Platform,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
    Role,
    Strategy,
    WarmupPolicy,
)
from engine_agent.reconfig.cleanup import CleanupWorker
from engine_agent.reconfig.errors import Aborted, Conflict, agent_error_of
from engine_agent.reconfig.faults import FaultSwitches
from engine_agent.reconfig.job import ExecutorHooks, Job, Site, StatusBoard
from engine_agent.reconfig.prepare import Builder
from engine_agent.reconfig.steps import steps_for
from engine_agent.reconfig.validate import validate
from engine_agent.reconfig.window import CommitWindow
from engine_agent.resident import ResidentWeights
from engine_agent.serving import PausedAt, ServingEngine

log = logging.getLogger(__name__)


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
        data_host: str = "127.0.0.1",
        resident: ResidentWeights | None = None,
    ) -> None:
        self.board = StatusBoard()
        self.site = Site(
            engine_id=engine_id,
            engine=engine,
            config=config,
            platform=platform,
            device=device,
            cleanup=cleanup,
            hooks=hooks or ExecutorHooks(),
            board=self.board,
            data_host=data_host,
            resident=resident or ResidentWeights(),
        )
        self.faults = FaultSwitches(cleanup)
        self.builder = Builder(self.site, self.faults)
        self.window = CommitWindow(self.site, self.builder, self.faults, default_pause_lease_s)
        self._lock = self.board.lock

    # ---- queries ---------------------------------------------------------------------------------

    def status(self) -> ReconfigStatus | None:
        return self.board.snapshot()

    def add_watcher(self, wake: Callable[[], None]) -> None:
        """`wake()` is called on every status change until removed (from the changing thread)."""
        self.board.add_watcher(wake)

    def remove_watcher(self, wake: Callable[[], None]) -> None:
        self.board.remove_watcher(wake)

    def inject(self, faults: FaultInjection) -> None:
        self.faults.inject(faults)

    # ---- the operations (each returns at once) ---------------------------------------------------

    def prepare(self, request: PrepareRequest) -> ReconfigStatus:
        site = self.site
        with self._lock:
            current = self.board.job
            unknown_abort = self.board.unknown_abort
            if unknown_abort is not None and unknown_abort.job_id == request.job_id:
                raise Conflict("job-aborted", f"job {request.job_id} was aborted here before its prepare")
            if current is not None and current.request.job_id == request.job_id:
                return current.status.model_copy(deep=True)  # a retried POST: same job
            if current is not None and current.status.phase not in TERMINAL_PHASES:
                raise Conflict(
                    "job-in-progress",
                    f"job {current.request.job_id} is {current.status.phase}; abort it first",
                )
            role = validate(site.engine_id, request, site.config, site.engine.active)
            policy = self.faults.warmup_policy_override or request.warmup_policy
            plan = steps_for(role, request.strategy, policy, graphs=site.engine.captures_graphs)
            job = Job(
                me=site.engine_id,
                request=request,
                role=role,
                policy=policy,
                plan=plan,
                counted=plan.prepare,
                status=ReconfigStatus(
                    job_id=request.job_id,
                    generation=request.generation,
                    role=role,
                    phase=ReconfigPhase.preparing,
                    steps_total=len(plan.prepare),
                    warmup_policy=policy,
                    strategy=request.strategy,
                    transfer_backend=request.transfer_backend,
                    updated_at=time.time(),
                ),
            )
            self.board.install(job)
            # A leaver keeps admitting until its pause (`CommitWindow.pause`): it serves while the new
            # generation is prepared, and only the requests it already holds are drained then.
            self._start(job, Operation.prepare, self._run_prepare)
            return job.status.model_copy(deep=True)

    def sync(self, job_id: str) -> ReconfigStatus:
        with self._lock:
            job = self._job_for(job_id)
            if done := self._already(job, Operation.sync):
                return done
            self._check_accepts(job, Operation.sync)
            self._start(job, Operation.sync, self.builder.sync)
            return job.status.model_copy(deep=True)

    def pause(self, job_id: str, lease_s: float | None) -> ReconfigStatus:
        with self._lock:
            job = self._job_for(job_id)
            if done := self._already(job, Operation.pause):
                return done
            self._check_accepts(job, Operation.pause)
            lease = lease_s or job.request.timeouts.pause_lease_s
            self._start(job, Operation.pause, lambda j: self.window.pause(j, lease))
            return job.status.model_copy(deep=True)

    def switch(self, job_id: str) -> ReconfigStatus:
        with self._lock:
            job = self._job_for(job_id)
            if done := self._already(job, Operation.switch):
                return done
            if job.at_boundary:
                return job.status.model_copy(deep=True)  # the engine-agreed window switches by itself
            if job.lease_expired:
                raise Conflict(
                    "pause-lease-expired",
                    f"job {job_id}: the pause lease ran out and this engine resumed generation "
                    f"{job.request.old_generation}; switch refused",
                )
            self._check_accepts(job, Operation.switch)
            if not job.paused:
                raise Conflict("wrong-phase", f"switch needs a paused engine, job is {job.status.phase}")
            self.window.cancel_lease(job)
            self._start(job, Operation.switch, self.window.switch)
            return job.status.model_copy(deep=True)

    def arm(
        self, job_id: str, deadline_s: float, lease_s: float | None, max_downtime_ms: int | None = None
    ) -> ReconfigStatus:
        """The engine-agreed commit (`protocol.ArmRequest`): answers at once; the worker arms, waits
        for the boundary, pauses, switches and resumes."""
        with self._lock:
            job = self._job_for(job_id)
            if job.status.phase in ARMED_ONWARD:
                return job.status.model_copy(deep=True)  # a retried arm changes nothing
            self._check_accepts(job, Operation.arm)
            lease = lease_s or job.request.timeouts.pause_lease_s
            self._start(job, Operation.arm, lambda j: self.window.arm(j, deadline_s, lease, max_downtime_ms))
            return job.status.model_copy(deep=True)

    def resume(self, job_id: str) -> ReconfigStatus:
        with self._lock:
            job = self._job_for(job_id)
            if done := self._already(job, Operation.resume):
                return done
            if job.status.phase in COMMITTING:
                raise Conflict(
                    "already-committed", f"job {job_id} switched; there is no old generation to resume"
                )
            if not job.paused:
                raise Conflict("wrong-phase", f"resume needs a paused engine, job is {job.status.phase}")
            self.window.cancel_lease(job)
            self._start(job, Operation.resume, self.window.resume)
            return job.status.model_copy(deep=True)

    def abort(self, job_id: str) -> ReconfigStatus:
        with self._lock:
            job = self.board.job
            unknown_abort = self.board.unknown_abort
            if unknown_abort is not None and unknown_abort.job_id == job_id:
                return unknown_abort.model_copy(deep=True)
            if job is None or job.request.job_id != job_id:
                if job is not None and job.status.phase not in TERMINAL_PHASES:
                    raise Conflict(
                        "job-in-progress", f"job {job.request.job_id} is active here, not {job_id}"
                    )
                return self._record_unknown_abort(job_id)
            if done := self._already(job, Operation.abort):
                return done
            if job.status.phase in COMMITTING:
                raise Conflict("already-committed", f"job {job_id} switched; abort is too late")
            if job.at_boundary and job.status.phase not in TERMINAL_PHASES:
                raise Conflict(
                    "already-committed",
                    f"job {job_id}: the engines reached the boundary they armed for; the switch goes on",
                )
            job.abort.set()
            self.window.cancel_lease(job)
            previous_error = job.status.error
            self.board.update(job, phase=ReconfigPhase.aborting, step=Operation.abort.value)
            worker = job.worker
        threading.Thread(
            target=self._run_abort, args=(job, worker, previous_error), name="abort", daemon=True
        ).start()
        return self.status() or job.status

    def on_engine_paused(self, paused: PausedAt) -> None:
        """The serving loop stopped at a boundary (see `CommitWindow.on_engine_paused`)."""
        self.window.on_engine_paused(paused)

    def shutdown(self) -> None:
        with self._lock:
            job = self.board.job
        if job is not None and job.status.phase not in TERMINAL_PHASES:
            job.abort.set()
            self.window.cancel_lease(job)
            self.window.back_to_old_generation(job)

    # ---- the work in the background ----------------------------------------------------------------

    def _run_prepare(self, job: Job) -> None:
        self.builder.run(job, job.plan.prepare)
        self.board.update(job, phase=MOVES[Operation.prepare].done, step=None)

    def _run_abort(
        self, job: Job, worker: threading.Thread | None, previous_error: AgentError | None
    ) -> None:
        if job.commit_armed and not self.site.engine.withdraw_arm(job.request.timeouts.collective_s):
            # The boundary came first: every member stopped there and switches, so must this one.
            log.warning(
                "job %s: abort came after the commit boundary; the switch goes on", job.request.job_id
            )
            with self._lock:
                job.abort.clear()
                if job.status.phase == ReconfigPhase.aborting:
                    self.board.update(job, phase=ReconfigPhase.paused, step=None)
            return
        if job.steps.in_old and job.status.pause is None:
            self.site.engine.resume()  # withdraw a pause request still waiting for its step boundary
        if worker is not None and worker is not threading.current_thread():
            # The running step ends at its own deadline at the latest (every wait has one).
            worker.join(timeout=job.longest_step_s())
        self.window.roll_back(job)
        self.board.update(job, phase=ReconfigPhase.aborted, step=None, error=previous_error)

    def _start(self, job: Job, operation: Operation, body: Callable[[Job], None]) -> None:
        """Enter the operation's running phase (prepare's is set already) and run `body` in a thread."""
        if operation != Operation.prepare:
            self.board.update(job, phase=MOVES[operation].running, step=operation.value)

        def run() -> None:
            try:
                body(job)
            except Aborted:
                pass  # the abort thread owns the outcome
            except Exception as exc:
                self._fail(job, exc)

        thread = threading.Thread(target=run, name=f"reconfig-{operation}", daemon=True)
        job.worker = thread
        thread.start()

    def _fail(self, job: Job, exc: Exception) -> None:
        if job.abort.is_set():
            return  # aborting: the abort thread owns the outcome
        error = agent_error_of(exc, job.status.step)
        log.warning("job %s failed at %s: %s", job.request.job_id, job.status.step, error.message)
        if job.status.phase == ReconfigPhase.switching:
            # Still paused on the old generation: the coordinator resumes or aborts, or the lease does.
            with self._lock:
                self.board.update(job, phase=ReconfigPhase.failed, error=error)
                self.window.start_lease(job, job.request.timeouts.pause_lease_s)
            return
        self.window.roll_back(job)
        self.board.update(job, phase=ReconfigPhase.failed, error=error)

    # ---- checks ----------------------------------------------------------------------------------

    def _job_for(self, job_id: str) -> Job:
        job = self.board.job
        if job is None:
            raise Conflict("no-job", f"no reconfiguration here; prepare job {job_id} first")
        if job.request.job_id != job_id:
            raise Conflict("wrong-job", f"job {job_id} is not the job here ({job.request.job_id})")
        return job

    @staticmethod
    def _already(job: Job, operation: Operation) -> ReconfigStatus | None:
        """The status, when the operation runs or ran already (a retried POST changes nothing)."""
        move = MOVES[operation]
        if job.status.phase in (move.running, move.done):
            return job.status.model_copy(deep=True)
        return None

    @staticmethod
    def _check_accepts(job: Job, operation: Operation) -> None:
        strategy = job.request.strategy
        accepted = ACCEPTS[strategy][operation]
        if job.status.phase not in accepted:
            wanted = "/".join(sorted(accepted))
            raise Conflict(
                "wrong-phase", f"{operation} needs phase {wanted} ({strategy}), job is {job.status.phase}"
            )

    def _record_unknown_abort(self, job_id: str) -> ReconfigStatus:
        """Abort of a job this agent never prepared (its prepare was lost or never sent): nothing to
        undo; `GET /v1/reconfig` reports it aborted so the coordinator's wait ends."""
        active = self.site.engine.active
        status = ReconfigStatus(
            job_id=job_id,
            generation=active.generation if active else 0,
            role=Role.staying if active else Role.joining,
            phase=ReconfigPhase.aborted,
            warmup_policy=WarmupPolicy.eager,
            strategy=Strategy.background,
            updated_at=time.time(),
        )
        self.board.record_unknown_abort(status)
        return status.model_copy(deep=True)
