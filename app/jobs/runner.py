"""The job runner: claims pending reconfiguration jobs and drives every engine through them.

    background strategy: prepare -> sync -> pause -> switch -> cleanup
    blocking strategy:   prepare -> pause -> sync -> switch -> cleanup   (prepare's work inside pause)

Claims: a job is run by the coordinator holding its lease (`lease_owner`, `lease_expires_at`). A claim
is one `UPDATE ... WHERE lease is free or expired`, so two coordinators on one Postgres never run the
same job; the holder renews the lease while it works, and a coordinator that finds a non-terminal job
whose lease expired (its holder died) reconciles it from what the agents report (`recovery.py`).

Failure rules (DESIGN.md, principles 4 and 5):
- anything failing before the pause (agent error, unreachable, deadline, launch failure, cancel):
  abort on every engine, release the joiners, job `rolled_back` (or `cancelled`), downtime 0;
- the pause not confirmed by every engine: resume all on the old generation, `rolled_back` with the
  short downtime it cost;
- the switch failing part-way: `failed`, deployment `degraded`, per-engine generations in the job.

Database work runs in worker threads (sync sessions), agent calls concurrently on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import Engine as DbEngine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from app.agents.client import (
    AgentCallError,
    AgentClient,
    AgentDeadlineExceeded,
    AgentPhaseFailed,
    AgentUnreachable,
)
from app.agents.fleet import Fleet
from app.core.clock import utc_now
from app.core.errors import DomainError
from app.deployments.models import Deployment, DeploymentStatus
from app.engines.models import Engine, EngineState
from app.jobs.downtime import Downtime, job_downtime
from app.jobs.models import CleanupState, ReconfigurationJob
from app.jobs.planner import DeploymentSpec, JobOptions, Plan, PlanError, make_plan
from app.jobs.states import TERMINAL_STATES, JobState, TransitionError, append_event, transition
from app.launchers.base import EngineHandle, Launcher, LaunchError, LaunchSpec
from engine_agent.protocol import (
    MAX_WAIT_S,
    TERMINAL_PHASES,
    AgentInfo,
    AgentState,
    EngineConfig,
    ReconfigPhase,
    ReconfigStatus,
    Role,
    Strategy,
    Timeouts,
    TransferBackend,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

S = JobState
TERMINAL_VALUES = sorted(s.value for s in TERMINAL_STATES)


class RunnerSettings(BaseSettings):
    """The runner's knobs (`EPCTL_RUNNER_*`); the lease length is the coordinator's `EPCTL_JOB_LEASE_S`."""

    model_config = SettingsConfigDict(env_prefix="EPCTL_RUNNER_", extra="ignore", env_ignore_empty=True)

    enabled: bool = True
    coordinator_id: str = Field("", description="lease owner name; default host:pid")
    poll_interval_s: float = Field(0.25, gt=0, description="how often to look for jobs to claim")
    agent_poll_interval_s: float = Field(0.05, gt=0, description="polling agents during prepare/sync")
    commit_poll_interval_s: float = Field(
        0.003, gt=0, description="polling agents inside the pause (agents that cannot long-poll)"
    )
    progress_long_poll_s: float = Field(
        1.0, gt=0, description="longest hold of one agent long-poll in prepare/sync (progress granularity)"
    )
    agent_call_timeout_s: float = Field(5.0, gt=0)
    launch_deadline_s: float = Field(60.0, gt=0)
    prepare_deadline_s: float = Field(120.0, gt=0)
    sync_deadline_s: float = Field(30.0, gt=0)
    pause_deadline_s: float = Field(10.0, gt=0, description="every engine confirms its pause within this")
    switch_deadline_s: float = Field(15.0, gt=0)
    abort_deadline_s: float = Field(10.0, gt=0)
    pause_lease_s: float = Field(10.0, gt=0, description="a paused agent resumes by itself after this")
    rendezvous_s: float = Field(30.0, gt=0)
    collective_s: float = Field(30.0, gt=0)
    transfer_s: float = Field(120.0, gt=0)
    cleanup_poll_interval_s: float = Field(0.5, gt=0)
    public_url: str | None = Field(None, description="the coordinator URL local agents register with")
    agent_token: str | None = Field(None, description="the token local agents register with")
    state_dir: Path | None = Field(None, description="local launcher state; default <data_dir>")
    local_agent_args: str = Field("", description="extra arguments for locally launched agents")
    local_agent_command: str = Field("", description="the agent command for the local launcher (epctl-agent)")
    transfer_backend: TransferBackend | None = Field(
        None, description="force the weight-transfer backend (default: NIXL when every engine has it)"
    )
    # Tests only: stop driving jobs at a named point (and write a marker file) so a test can SIGKILL
    # the coordinator there. Points: prepared, synced, paused, switched, cleaning_up.
    test_hang_at: str | None = None
    test_marker_file: Path | None = None


def load_runner_settings() -> RunnerSettings:
    """The runner's settings, or `ConfigError` naming every bad `EPCTL_RUNNER_*` value."""
    from pydantic import ValidationError

    from app.core.config import ConfigError

    try:
        return RunnerSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"EPCTL_RUNNER_{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from None


# --- errors -------------------------------------------------------------------------------------------


class JobFailure(Exception):
    """Stops a job before commit; `error` is what the job records."""

    def __init__(self, phase: str, type_: str, message: str, engine_id: str | None = None) -> None:
        super().__init__(message)
        self.error = {"phase": phase, "engine_id": engine_id, "type": type_, "message": message}

    @classmethod
    def from_exception(cls, phase: str, exc: BaseException) -> JobFailure:
        if isinstance(exc, JobFailure):
            return exc
        if isinstance(exc, AgentCallError):
            return cls(phase, exc.type, exc.message, exc.engine_id)
        if isinstance(exc, LaunchError):
            return cls(phase, exc.type, exc.message, exc.engine_id)
        if isinstance(exc, PlanError):
            return cls(phase, exc.type, exc.message, exc.engine_id)
        if isinstance(exc, DomainError):
            return cls(phase, exc.code, exc.detail)
        return cls(phase, "internal_error", f"{exc.__class__.__name__}: {exc}")


class JobCancelled(JobFailure):
    def __init__(self, phase: str) -> None:
        super().__init__(phase, "cancelled", "cancelled on request")


class LeaseLost(Exception):
    """Another coordinator holds the job now; stop touching it."""


# --- the per-job context ------------------------------------------------------------------------------


@dataclass
class JobRun:
    job_id: str
    deployment_id: str
    deployment_name: str
    launcher_name: str
    engine_config: EngineConfig
    state: JobState
    strategy: Strategy
    warmup_requested: str | None
    plan: Plan | None = None
    clients: dict[str, AgentClient] = field(default_factory=dict)
    statuses: dict[str, ReconfigStatus] = field(default_factory=dict)
    infos: dict[str, AgentInfo] = field(default_factory=dict)
    launched: list[EngineHandle] = field(default_factory=list)
    progress_step: str | None = None
    progress_percent: float = 0.0
    # Coordinator-side timing of the commit window (monotonic seconds), to show where downtime goes.
    commit_marks: dict[str, float] = field(default_factory=dict)

    def commit_timing_ms(self) -> dict[str, float]:
        marks = self.commit_marks
        spans = {
            "pause_confirm_ms": ("pause_sent", "all_paused"),
            "paused_to_switch_sent_ms": ("all_paused", "switch_sent"),
            "switch_confirm_ms": ("switch_sent", "all_committed"),
        }
        return {
            name: round((marks[b] - marks[a]) * 1000.0, 3)
            for name, (a, b) in spans.items()
            if a in marks and b in marks
        }

    def participant_clients(self) -> list[AgentClient]:
        assert self.plan is not None
        return [self.clients[m.engine_id] for m in self.plan.participants]

    def member_clients(self) -> list[AgentClient]:
        assert self.plan is not None
        return [self.clients[m.engine_id] for m in self.plan.members]


# Progress bands per phase: percent = start + (end - start) * fraction done.
PROGRESS_BANDS: Mapping[str, tuple[float, float]] = {
    "launching": (0.0, 10.0),
    "preparing": (10.0, 60.0),
    "syncing": (60.0, 70.0),
    "pausing": (70.0, 80.0),
    "switching": (80.0, 90.0),
    "cleaning_up": (90.0, 100.0),
}


def _consume_outcome(future: asyncio.Future[Any]) -> None:
    """Mark a call's outcome seen: one left running after its waiter was cancelled must not log
    'exception was never retrieved'."""
    if not future.cancelled():
        future.exception()


def _progress_of(statuses: Iterable[ReconfigStatus]) -> float:
    done = total = 0
    for status in statuses:
        done += status.steps_done
        total += status.steps_total
    return done / total if total else 0.0


# --- the runner ---------------------------------------------------------------------------------------


class JobRunner:
    def __init__(
        self,
        db: DbEngine,
        *,
        launchers: Mapping[str, Launcher],
        lease_s: float = 30.0,
        settings: RunnerSettings | None = None,
    ) -> None:
        self.db = db
        self.settings = settings or RunnerSettings()
        self.launchers = dict(launchers)
        self.lease_s = lease_s
        self.owner = self.settings.coordinator_id or f"{socket.gethostname()}:{os.getpid()}"
        self._running: dict[str, asyncio.Task[None]] = {}
        # A snapshot of `_running`'s keys for the claim queries, which run in worker threads.
        self._running_ids: frozenset[str] = frozenset()
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_cleanup_poll = 0.0

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Reconcile what a predecessor left, then claim and run jobs in the background."""
        if not self.settings.enabled:
            return
        self._loop_task = asyncio.create_task(self._loop(), name="job-runner")

    async def stop(self) -> None:
        self._stopping = True
        tasks = [t for t in [self._loop_task, *self._running.values()] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # Let our leases go so another coordinator (or our successor) reconciles without waiting.
        with contextlib.suppress(Exception):
            await self._db(self._release_leases)

    async def _loop(self) -> None:
        from app.jobs import cleanup, recovery

        while not self._stopping:
            try:
                for job_id in await self._db(self._claim_stranded):
                    self._spawn(job_id, recovery.reconcile_job(self, job_id))
                pending_id = await self._db(self._claim_pending)
                if pending_id is not None:
                    self._spawn(pending_id, self.run_job(pending_id))
                if time.monotonic() - self._last_cleanup_poll >= self.settings.cleanup_poll_interval_s:
                    self._last_cleanup_poll = time.monotonic()
                    await cleanup.poll_cleanup_outcomes(self)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("job runner tick failed")
            await asyncio.sleep(self.settings.poll_interval_s)

    def _spawn(self, job_id: str, work: Any) -> None:
        async def guarded() -> None:
            renew = asyncio.create_task(self._renew_lease(job_id, asyncio.current_task()))
            try:
                await work
            except (asyncio.CancelledError, LeaseLost):
                pass
            except Exception:
                log.exception("job %s: runner crashed", job_id)
            finally:
                renew.cancel()
                self._running.pop(job_id, None)
                self._running_ids = frozenset(self._running)

        self._running[job_id] = asyncio.create_task(guarded(), name=f"job-{job_id}")
        self._running_ids = frozenset(self._running)

    async def _renew_lease(self, job_id: str, worker: asyncio.Task[Any] | None) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                held = await self._db(lambda s: self._extend_lease(s, job_id))
            except Exception:
                log.exception("job %s: lease renewal failed", job_id)
                continue
            if not held:
                log.warning("job %s: lease lost to another coordinator; stopping", job_id)
                if worker is not None:
                    worker.cancel()
                return

    # --- database helpers (run in a worker thread) ------------------------------------------------

    async def _db(self, work: Callable[[Session], T]) -> T:
        def run() -> T:
            with Session(self.db, expire_on_commit=False) as session:
                return work(session)

        return await asyncio.to_thread(run)

    def _lease_free(self, table: Any, now: Any) -> Any:
        return sa.or_(
            table.c.lease_owner.is_(None),
            table.c.lease_expires_at.is_(None),
            table.c.lease_expires_at < now,
            sa.and_(table.c.lease_owner == self.owner, table.c.id.not_in(sorted(self._running_ids) or [""])),
        )

    def _try_claim(self, session: Session, job_id: str, extra: Any = None) -> bool:
        table = ReconfigurationJob.__table__  # type: ignore[attr-defined]
        now = utc_now()
        statement = (
            sa.update(table)
            .where(table.c.id == job_id, table.c.state.not_in(TERMINAL_VALUES), self._lease_free(table, now))
            .values(lease_owner=self.owner, lease_expires_at=now + timedelta(seconds=self.lease_s))
        )
        if extra is not None:
            statement = statement.where(extra)
        claimed = session.execute(statement).rowcount == 1  # type: ignore[attr-defined]
        session.commit()
        return claimed

    def _claim_pending(self, session: Session) -> str | None:
        table = ReconfigurationJob.__table__  # type: ignore[attr-defined]
        now = utc_now()
        candidates = session.execute(
            sa.select(table.c.id)
            .where(table.c.state == S.pending.value, self._lease_free(table, now))
            .order_by(table.c.created_at)
            .limit(5)
        ).all()
        for (job_id,) in candidates:
            if job_id in self._running_ids:
                continue
            if self._try_claim(session, job_id, table.c.state == S.pending.value):
                return str(job_id)
        return None

    def _claim_stranded(self, session: Session) -> list[str]:
        """Jobs past pending whose holder is gone (lease expired) or was us before a restart."""
        table = ReconfigurationJob.__table__  # type: ignore[attr-defined]
        now = utc_now()
        candidates = session.execute(
            sa.select(table.c.id).where(
                table.c.state.not_in([*TERMINAL_VALUES, S.pending.value]), self._lease_free(table, now)
            )
        ).all()
        claimed = []
        for (job_id,) in candidates:
            if job_id not in self._running_ids and self._try_claim(session, job_id):
                claimed.append(str(job_id))
        return claimed

    def _extend_lease(self, session: Session, job_id: str) -> bool:
        table = ReconfigurationJob.__table__  # type: ignore[attr-defined]
        now = utc_now()
        result = session.execute(
            sa.update(table)
            .where(table.c.id == job_id, table.c.lease_owner == self.owner)
            .values(lease_expires_at=now + timedelta(seconds=self.lease_s))
        )
        session.commit()
        if result.rowcount == 1:  # type: ignore[attr-defined]
            return True
        job = session.get(ReconfigurationJob, job_id)
        # A terminal job drops its lease: that is the end of the work, not a loss.
        return job is not None and JobState(job.state) in TERMINAL_STATES

    def _release_leases(self, session: Session) -> None:
        table = ReconfigurationJob.__table__  # type: ignore[attr-defined]
        session.execute(
            sa.update(table)
            .where(table.c.lease_owner == self.owner, table.c.state.not_in(TERMINAL_VALUES))
            .values(lease_expires_at=utc_now())
        )
        session.commit()

    # --- job bookkeeping --------------------------------------------------------------------------

    async def load_run(self, job_id: str) -> JobRun:
        def load(session: Session) -> JobRun:
            job = session.get(ReconfigurationJob, job_id)
            if job is None:
                raise LookupError(job_id)
            deployment = session.get(Deployment, job.deployment_id)
            assert deployment is not None
            return JobRun(
                job_id=job.id,
                deployment_id=deployment.id,
                deployment_name=deployment.name,
                launcher_name=deployment.launcher,
                engine_config=EngineConfig.model_validate(deployment.engine_config),
                state=JobState(job.state),
                strategy=Strategy(job.strategy),
                warmup_requested=job.warmup_policy_requested,
            )

        return await self._db(load)

    async def move(
        self,
        run: JobRun,
        to_state: JobState,
        *,
        message: str | None = None,
        changes: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        also: Callable[[Session], None] | None = None,
    ) -> None:
        """One job transition (CAS + log + outbox); `also` adds deployment/engine changes to the same
        transaction."""

        def work(session: Session) -> None:
            if also is not None:
                also(session)
            transition(
                session,
                job_id=run.job_id,
                from_state=run.state,
                to_state=to_state,
                message=message,
                data=data,
                changes=changes,
            )

        try:
            await self._db(work)
        except TransitionError as exc:
            # The job moved under us (e.g. an operator cancelled a pending job): not ours to drive.
            raise LeaseLost(str(exc)) from exc
        run.state = to_state

    async def note(
        self,
        run: JobRun,
        kind: str,
        message: str | None = None,
        *,
        data: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
    ) -> None:
        await self._db(
            lambda s: append_event(
                s, job_id=run.job_id, kind=kind, message=message, data=data, changes=changes
            )
        )

    async def progress(self, run: JobRun, step: str, fraction: float = 0.0) -> None:
        """Record progress (an event per new step, or per 10% within one)."""
        start, end = PROGRESS_BANDS.get(step.split(":")[0], (0.0, 100.0))
        percent = round(start + (end - start) * max(0.0, min(fraction, 1.0)), 1)
        if step == run.progress_step and percent - run.progress_percent < 10.0:
            return
        run.progress_step, run.progress_percent = step, percent
        await self.note(
            run,
            "progress",
            step,
            data={"step": step, "percent": percent},
            changes={"progress_step": step, "progress_percent": percent},
        )

    async def cancel_requested(self, run: JobRun) -> bool:
        def read(session: Session) -> bool:
            job = session.get(ReconfigurationJob, run.job_id, populate_existing=True)
            return bool(job and job.cancel_requested)

        return await self._db(read)

    def downtime_of(self, run: JobRun, *, now: float | None = None) -> Downtime:
        """The union of the pauses of the engines that were serving (the old generation's members):
        a joiner was not serving before, so its wait stops no one; its own interval is still listed."""
        pauses = {eid: s.pause for eid, s in run.statuses.items() if s.job_id == run.job_id}
        old = {m.engine_id for m in run.plan.old_members} if run.plan and run.plan.old_members else None
        return job_downtime(pauses, now=now, serving=old)

    def engine_results(self, run: JobRun) -> list[dict[str, Any]]:
        """Per-engine results: role, ranks, the agent's phase, generation, pause and transfer."""
        plan = run.plan
        if plan is None:
            return []
        old_rank = {m.engine_id: i for i, m in enumerate(plan.old_members)}
        new_rank = {m.engine_id: i for i, m in enumerate(plan.members)}
        results = []
        for member in plan.participants:
            status = run.statuses.get(member.engine_id)
            info = run.infos.get(member.engine_id)
            results.append(
                {
                    "engine_id": member.engine_id,
                    "url": member.url,
                    "role": plan.role(member.engine_id).value,
                    "old_rank": old_rank.get(member.engine_id),
                    "new_rank": new_rank.get(member.engine_id),
                    "platform": info.platform.value if info else None,
                    "phase": status.phase.value if status else None,
                    "generation": status.generation if status else None,
                    "step": status.step if status else None,
                    "bytes_moved": status.bytes_moved if status else 0,
                    "transfer_backend": status.transfer_backend.value
                    if status and status.transfer_backend
                    else None,
                    "synced_value": status.synced_value if status else None,
                    "pause": status.pause.model_dump(mode="json") if status and status.pause else None,
                    "error": status.error.model_dump(mode="json") if status and status.error else None,
                }
            )
        return results

    # --- talking to agents ------------------------------------------------------------------------

    def fleet(self) -> Fleet:
        return Fleet(timeout_s=self.settings.agent_call_timeout_s)

    async def known_engines(self, deployment_id: str) -> list[Engine]:
        def read(session: Session) -> list[Engine]:
            rows = session.exec(
                select(Engine).where(
                    Engine.deployment_id == deployment_id, Engine.state != EngineState.left.value
                )
            ).all()
            return list(rows)

        return await self._db(read)

    async def await_phase(
        self,
        run: JobRun,
        fleet: Fleet,
        clients: Sequence[AgentClient],
        phases: Iterable[ReconfigPhase],
        *,
        job_phase: str,
        deadline_s: float,
        poll_interval_s: float,
        progress_step: str | None = None,
        cancellable: bool = False,
    ) -> dict[str, ReconfigStatus]:
        """Wait until every client's reconfiguration reached one of `phases`, starting from the answer
        each gave to the last step sent to it (no call at all when that answer already says so), then
        long-polling `GET /v1/reconfig` (polling, for agents that cannot long-poll).

        Raises `JobFailure` at the first agent that fails, is unreachable, or at the deadline;
        `JobCancelled` when cancellation was requested (if `cancellable`).
        """
        return await self.drive(
            run,
            fleet,
            clients,
            phases,
            job_phase=job_phase,
            deadline_s=deadline_s,
            poll_interval_s=poll_interval_s,
            progress_step=progress_step,
            cancellable=cancellable,
        )

    async def drive(
        self,
        run: JobRun,
        fleet: Fleet,
        clients: Sequence[AgentClient],
        phases: Iterable[ReconfigPhase],
        *,
        job_phase: str,
        deadline_s: float,
        poll_interval_s: float,
        send: Callable[[AgentClient, float], Awaitable[ReconfigStatus]] | None = None,
        progress_step: str | None = None,
        cancellable: bool = False,
    ) -> dict[str, ReconfigStatus]:
        """One step on every client at once: `send(client, wait_s)` (a step POST that the agent may
        hold until the step's phase) and then, where that answer is not yet in `phases`, long-polls.
        Each engine costs one HTTP exchange when the agent answers in time, and every engine is
        followed on its own, so nobody waits for a round of polls.

        `deadline_s` covers the sends and the waits. Raises `JobFailure` at the first failure (any
        send error, an unreachable agent, an agent in a terminal phase or reporting an error, the
        deadline), after cancelling the waits still out (a step already on its way is let finish,
        so no engine misses it); `JobCancelled` when cancellation was requested (if `cancellable`)."""
        wanted = frozenset(phases)
        give_up = time.monotonic() + deadline_s
        hold_s = self.settings.progress_long_poll_s if progress_step is not None else MAX_WAIT_S
        tasks = {
            c.engine_id: asyncio.create_task(
                self._follow(run, c, wanted, give_up, send, poll_interval_s, hold_s, deadline_s)
            )
            for c in clients
        }
        ticking = progress_step is not None or cancellable
        last_cancel_check = time.monotonic()
        pending: set[asyncio.Task[ReconfigStatus]] = set(tasks.values())
        try:
            while pending:
                # The engines' own waits end at the deadline; this bound only guards against a stuck call.
                timeout = give_up + 1.0 - time.monotonic()
                if ticking:
                    timeout = min(timeout, 0.2)
                done, pending = await asyncio.wait(
                    pending, timeout=max(timeout, 0.0), return_when=asyncio.FIRST_COMPLETED
                )
                for client in clients:
                    task = tasks[client.engine_id]
                    error = task.exception() if task in done else None
                    if error is not None:
                        raise JobFailure.from_exception(job_phase, error)
                if not pending:
                    break
                if progress_step is not None:
                    await self.progress(
                        run,
                        progress_step,
                        _progress_of(
                            run.statuses[c.engine_id] for c in clients if c.engine_id in run.statuses
                        ),
                    )
                now = time.monotonic()
                if cancellable and now - last_cancel_check >= 0.2:
                    last_cancel_check = now
                    if await self.cancel_requested(run):
                        raise JobCancelled(job_phase)
                if now >= give_up + 1.0:
                    late = next(c.engine_id for c in clients if tasks[c.engine_id] in pending)
                    raise JobFailure.from_exception(job_phase, self._late(run, late, wanted, deadline_s))
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        if progress_step is not None:
            await self.progress(run, progress_step, 1.0)
        return {engine_id: task.result() for engine_id, task in tasks.items()}

    @staticmethod
    def _late(
        run: JobRun, engine_id: str, wanted: frozenset[ReconfigPhase], deadline_s: float
    ) -> AgentDeadlineExceeded:
        status = run.statuses.get(engine_id)
        where = f" (agent at {status.phase.value}, step {status.step})" if status else ""
        return AgentDeadlineExceeded(
            engine_id, f"did not reach {'/'.join(sorted(wanted))} within {deadline_s:.1f}s{where}"
        )

    async def _follow(
        self,
        run: JobRun,
        client: AgentClient,
        wanted: frozenset[ReconfigPhase],
        give_up: float,
        send: Callable[[AgentClient, float], Awaitable[ReconfigStatus]] | None,
        poll_interval_s: float,
        hold_s: float,
        deadline_s: float,
    ) -> ReconfigStatus:
        """One engine until it reaches `wanted`: its step's answer, then long-polls (or polls)."""
        status: ReconfigStatus | None
        if send is not None:
            # Shielded: when another engine fails first, this engine still gets its step (a switch
            # or pause half-sent would leave it behind); only the wait for its answer is dropped.
            sending = asyncio.ensure_future(send(client, max(min(give_up - time.monotonic(), hold_s), 0.0)))
            sending.add_done_callback(_consume_outcome)
            status = await asyncio.shield(sending)
        else:
            status = client.last_step_status
        while True:
            if status is not None and status.job_id == run.job_id:
                run.statuses[client.engine_id] = status
                if status.phase in wanted:
                    return status
                if status.phase in TERMINAL_PHASES or status.error is not None:
                    raise AgentPhaseFailed(client.engine_id, status, wanted)
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                raise self._late(run, client.engine_id, wanted, deadline_s)
            try:
                status = await client.watch(run.job_id, wanted, wait_s=min(remaining, hold_s))
            except AgentUnreachable:
                raise
            except AgentCallError:
                status = None  # a slow answer: ask again
            if status is None or not client.long_poll:
                # Not held by the agent (no job there yet, an error, or an agent that cannot hold).
                await asyncio.sleep(min(poll_interval_s, max(give_up - time.monotonic(), 0.0)))

    async def _send(
        self, fleet: Fleet, clients: Sequence[AgentClient], call: Callable[[AgentClient], Any], job_phase: str
    ) -> None:
        try:
            await fleet.all(clients, call)
        except AgentCallError as exc:
            raise JobFailure.from_exception(job_phase, exc) from exc

    async def test_hang(self, point: str) -> None:
        """Tests only: stop here (forever) so the coordinator can be killed at this point."""
        if self.settings.test_hang_at != point:
            return
        log.warning("test hook: hanging at %s", point)
        if self.settings.test_marker_file is not None:
            self.settings.test_marker_file.write_text(point)
        while True:
            await asyncio.sleep(3600)

    # --- one job, start to end --------------------------------------------------------------------

    def launch_spec(self, run: JobRun) -> LaunchSpec:
        return LaunchSpec(
            deployment=run.deployment_name,
            engine=run.engine_config,
            coordinator_url=self.settings.public_url,
            token=self.settings.agent_token,
            extra_args=tuple(shlex.split(self.settings.local_agent_args)),
        )

    def launcher_for(self, run: JobRun) -> Launcher:
        launcher = self.launchers.get(run.launcher_name)
        if launcher is None:
            raise JobFailure(
                "preparing", "unknown_launcher", f"no launcher {run.launcher_name!r} is configured"
            )
        return launcher

    async def run_job(self, job_id: str) -> None:
        run = await self.load_run(job_id)
        if run.state != S.pending:
            return
        async with self.fleet() as fleet:
            if await self.cancel_requested(run):
                await self.move(
                    run,
                    S.cancelled,
                    message="cancelled before it started",
                    changes={"error": JobCancelled("pending").error},
                )
                return
            await self.move(run, S.preparing, message="claimed by " + self.owner)
            try:
                await self._prepare(run, fleet)
                if run.strategy == Strategy.background:
                    await self.move(run, S.syncing)
                    await self._sync(run, fleet)
                    if await self.cancel_requested(run):
                        raise JobCancelled("syncing")
                    await self.move(run, S.committing)
                    if not await self._pause(run, fleet, job_phase="committing"):
                        return
                else:
                    # Blocking: prepare's work runs inside the pause, then sync, then switch.
                    if not await self._pause(run, fleet, job_phase="preparing"):
                        return
                    await self.move(run, S.syncing)
                    try:
                        await self._sync(run, fleet)
                    except JobFailure as failure:
                        await self._resume_all(run, fleet, failure)
                        return
                    await self.move(run, S.committing)
            except JobFailure as failure:
                await self._roll_back(run, fleet, failure)
                return
            await self._switch(run, fleet)

    async def _prepare(self, run: JobRun, fleet: Fleet) -> None:
        phase = "preparing"
        try:
            deployment, rows = await self._db(lambda s: self._deployment_and_engines(s, run))
            await self.progress(run, "launching")
            infos = await self._agent_infos(run, fleet, deployment, rows)
            members_now = [
                i for i in infos if i.state != AgentState.idle and i.generation == deployment.generation
            ]
            idle = [i for i in infos if i.state == AgentState.idle]
            target = await self._db(lambda s: self._target(s, run))
            need = target - len(members_now)
            if need > 0 and len(idle) < need:
                launcher = self.launcher_for(run)
                handles = [EngineHandle(engine_id=i.engine_id, url=i.url) for i in idle]
                ready = await launcher.ensure_engines(
                    self.launch_spec(run), need, handles, deadline_s=self.settings.launch_deadline_s
                )
                known = {i.engine_id for i in idle}
                run.launched = [h for h in ready if h.engine_id not in known]
                new_infos = await fleet.all(
                    [fleet.client(h.engine_id, h.url) for h in run.launched], lambda c: c.info()
                )
                await self._db(lambda s: self._upsert_engines(s, run, list(new_infos.values())))
                infos += list(new_infos.values())
                idle += list(new_infos.values())
            spec = DeploymentSpec(
                name=deployment.name,
                num_logical_experts=run.engine_config.num_logical_experts,
                num_redundant_experts=run.engine_config.num_redundant_experts,
                generation=deployment.generation,
                warmup_policy=deployment.warmup_policy,  # type: ignore[arg-type]
            )
            options = JobOptions(
                warmup_policy=run.warmup_requested,  # type: ignore[arg-type]
                strategy=run.strategy,
                transfer_backend=self.settings.transfer_backend,
            )
            run.plan = make_plan(spec, members_now + idle, target, options)
            run.infos = {i.engine_id: i for i in infos}
            run.clients = {m.engine_id: fleet.client(m.engine_id, m.url) for m in run.plan.participants}
            await self.note(
                run,
                "plan",
                f"{run.plan.from_size} -> {run.plan.to_size}, warm-up {run.plan.warmup_policy.value} "
                f"({run.plan.warmup_reason}), transfer {run.plan.transfer_backend.value}",
                data=run.plan.summary(),
                changes={
                    "warmup_policy": run.plan.warmup_policy.value,
                    "engine_results": self.engine_results(run),
                },
            )
            if await self.cancel_requested(run):
                raise JobCancelled(phase)
            request = run.plan.prepare_request(
                run.job_id,
                Timeouts(
                    rendezvous_s=self.settings.rendezvous_s,
                    collective_s=self.settings.collective_s,
                    transfer_s=self.settings.transfer_s,
                    pause_lease_s=self.settings.pause_lease_s,
                ),
            )
            await self.settle_earlier_jobs(run, fleet, run.participant_clients())
            await self.drive(
                run,
                fleet,
                run.participant_clients(),
                {ReconfigPhase.prepared},
                send=lambda c, wait_s: c.prepare(request, wait_s=wait_s),
                job_phase=phase,
                deadline_s=self.settings.prepare_deadline_s,
                poll_interval_s=self.settings.agent_poll_interval_s,
                progress_step="preparing",
                cancellable=True,
            )
            await self.note(run, "engines", "prepared", changes={"engine_results": self.engine_results(run)})
            await self.test_hang("prepared")
        except JobFailure:
            raise
        except (AgentCallError, LaunchError, PlanError, DomainError) as exc:
            raise JobFailure.from_exception(phase, exc) from exc

    async def _sync(self, run: JobRun, fleet: Fleet) -> None:
        phase = "syncing"
        await self.drive(
            run,
            fleet,
            run.member_clients(),
            {ReconfigPhase.synced},
            send=lambda c, wait_s: c.sync(run.job_id, wait_s=wait_s),
            job_phase=phase,
            deadline_s=self.settings.sync_deadline_s,
            poll_interval_s=self.settings.agent_poll_interval_s,
            progress_step="syncing",
            cancellable=run.strategy == Strategy.background,
        )
        await self.test_hang("synced")

    async def _pause(self, run: JobRun, fleet: Fleet, *, job_phase: str) -> bool:
        """First half of the commit. True when every participant confirmed its pause; otherwise all
        were resumed on the old generation and the job was closed (False)."""
        clients = run.participant_clients()
        await self.progress(run, "pausing")
        try:
            run.commit_marks["pause_sent"] = time.monotonic()
            # One exchange per engine: the agent answers once paused (or failed).
            await self.drive(
                run,
                fleet,
                clients,
                {ReconfigPhase.paused},
                send=lambda c, wait_s: c.pause(
                    run.job_id, lease_s=self.settings.pause_lease_s, wait_s=wait_s
                ),
                job_phase=job_phase,
                # Blocking: all of prepare's work happens inside this pause.
                deadline_s=self.settings.prepare_deadline_s
                if run.strategy == Strategy.blocking
                else self.settings.pause_deadline_s,
                poll_interval_s=self.settings.commit_poll_interval_s,
            )
            run.commit_marks["all_paused"] = time.monotonic()
        except JobFailure as failure:
            await self._resume_all(run, fleet, failure)
            return False
        await self.test_hang("paused")
        return True

    async def _resume_all(self, run: JobRun, fleet: Fleet, failure: JobFailure) -> None:
        """The pause was not confirmed everywhere: every participant back on the old generation.

        `abort` is the agents' one way back from any phase before the switch: it resumes a paused
        engine on the generation it still holds and destroys what prepare built."""
        clients = run.participant_clients()
        await fleet.each(clients, lambda c: c.abort(run.job_id))
        await self.await_settled(run, fleet, clients, {ReconfigPhase.resumed, ReconfigPhase.aborted})
        await self._release_joiners(run)
        downtime = self.downtime_of(run, now=time.time())
        cancelled = isinstance(failure, JobCancelled)
        await self.move(
            run,
            S.cancelled if cancelled else S.rolled_back,
            message=f"{failure.error['message']}; every engine resumed the old generation",
            changes={
                "error": failure.error,
                "downtime_ms": downtime.downtime_ms,
                "downtime": {**downtime.as_dict(), "coordinator": run.commit_timing_ms()},
                "engine_results": self.engine_results(run),
            },
        )

    async def await_settled(
        self, run: JobRun, fleet: Fleet, clients: Sequence[AgentClient], phases: set[ReconfigPhase]
    ) -> None:
        """Best effort: wait until every reachable agent reached one of `phases` (or any terminal one).

        An agent's abort first lets its running step end, which can take that step's own deadline
        (a rendezvous, a collective, a transfer): wait that long at least."""
        give_up = time.monotonic() + max(self.settings.abort_deadline_s, self.longest_agent_step_s())
        waiting = {c.engine_id: c for c in clients}
        while waiting and time.monotonic() < give_up:
            results = await fleet.each(waiting.values(), lambda c: c.reconfig())
            for engine_id, result in results.items():
                if isinstance(result, AgentUnreachable):
                    waiting.pop(engine_id)
                elif isinstance(result, AgentCallError):
                    continue
                elif result is None or result.job_id != run.job_id:
                    waiting.pop(engine_id)
                else:
                    run.statuses[engine_id] = result
                    if result.phase in phases or result.phase in TERMINAL_PHASES:
                        waiting.pop(engine_id)
            if waiting:
                await asyncio.sleep(self.settings.agent_poll_interval_s)

    def longest_agent_step_s(self) -> float:
        settings = self.settings
        return max(settings.rendezvous_s, settings.collective_s, settings.transfer_s) + 2.0

    async def settle_earlier_jobs(self, run: JobRun, fleet: Fleet, clients: Sequence[AgentClient]) -> None:
        """An agent still busy with another job (an abort still finishing, or a job a crashed
        coordinator left behind: one deployment has one active job, so any other is stale) is aborted
        and waited for, so this job's prepare is not refused."""
        statuses = await fleet.each(clients, lambda c: c.reconfig())
        busy: dict[str, tuple[AgentClient, str]] = {}
        for client in clients:
            status = statuses[client.engine_id]
            stale = isinstance(status, ReconfigStatus) and status.job_id != run.job_id
            if stale and isinstance(status, ReconfigStatus) and status.phase not in TERMINAL_PHASES:
                busy[client.engine_id] = (client, status.job_id)
        if not busy:
            return
        await self.note(run, "settle", f"waiting for earlier jobs to finish on {sorted(busy)}")
        for client, stale_job in busy.values():
            with contextlib.suppress(AgentCallError):
                await client.abort(stale_job)
        give_up = time.monotonic() + self.longest_agent_step_s() + self.settings.abort_deadline_s
        while busy and time.monotonic() < give_up:
            await asyncio.sleep(self.settings.agent_poll_interval_s)
            results = await fleet.each([c for c, _ in busy.values()], lambda c: c.reconfig())
            for engine_id, result in results.items():
                if not isinstance(result, ReconfigStatus) or result.phase in TERMINAL_PHASES:
                    busy.pop(engine_id, None)

    async def _roll_back(self, run: JobRun, fleet: Fleet, failure: JobFailure) -> None:
        """A failure before the pause: abort everywhere, release joiners; the old generation served
        throughout (downtime 0)."""
        if run.plan is not None:
            clients = run.participant_clients()
            await fleet.each(clients, lambda c: c.abort(run.job_id))
            await self.await_settled(run, fleet, clients, {ReconfigPhase.aborted})
        await self._release_joiners(run)
        cancelled = isinstance(failure, JobCancelled)
        await self.move(
            run,
            S.cancelled if cancelled else S.rolled_back,
            message=failure.error["message"],
            changes={
                "error": failure.error,
                "downtime_ms": 0.0,
                "downtime": {"downtime_ms": 0.0, "per_engine_ms": {}},
                "engine_results": self.engine_results(run),
            },
        )

    async def _release_joiners(self, run: JobRun) -> None:
        handles = list(run.launched)
        if run.plan is not None:
            known = {h.engine_id for h in handles}
            handles += [
                EngineHandle(engine_id=m.engine_id, url=m.url)
                for m in run.plan.members
                if m.engine_id in run.plan.joiners and m.engine_id not in known
            ]
        if not handles:
            return
        launcher = self.launchers.get(run.launcher_name)
        if launcher is None:
            return
        try:
            gone = await launcher.release(self.launch_spec(run), handles)
        except Exception:
            log.exception("job %s: releasing joiners failed", run.job_id)
            return
        if gone:
            await self._db(lambda s: self._mark_left(s, gone))

    async def _switch(self, run: JobRun, fleet: Fleet) -> None:
        """Second half of the commit: every participant switches, or the job fails (degraded)."""
        assert run.plan is not None
        clients = run.participant_clients()
        # Nothing but the switch inside the window: it goes out the moment the last pause is confirmed,
        # and progress is written once everyone switched. One exchange per engine: the agent answers
        # once committed (or failed).
        run.commit_marks["switch_sent"] = time.monotonic()
        failure: JobFailure | None = None
        try:
            await self.drive(
                run,
                fleet,
                clients,
                {ReconfigPhase.committed},
                send=lambda c, wait_s: c.switch(run.job_id, wait_s=wait_s),
                job_phase="committing",
                deadline_s=self.settings.switch_deadline_s,
                poll_interval_s=self.settings.commit_poll_interval_s,
            )
            run.commit_marks["all_committed"] = time.monotonic()
        except JobFailure as exc:
            failure = exc
        if failure is not None:
            await self.fail_switch(run, fleet, failure)
            return
        await self.test_hang("switched")
        await self.finish(run)

    async def fail_switch(self, run: JobRun, fleet: Fleet, failure: JobFailure) -> None:
        """Part of the engines switched, part did not: the deployment is degraded, the job failed,
        and the job shows which engine is on which generation."""
        assert run.plan is not None
        infos = await fleet.each(run.participant_clients(), lambda c: c.info())
        generations = {
            eid: (
                {"generation": i.generation, "state": i.state.value, "rank": i.rank}
                if isinstance(i, AgentInfo)
                else {"generation": None, "state": "unreachable", "rank": None}
            )
            for eid, i in infos.items()
        }
        results = self.engine_results(run)
        for result in results:
            result["agent"] = generations.get(result["engine_id"])
        downtime = self.downtime_of(run, now=time.time())

        def degrade(session: Session) -> None:
            deployment = session.get(Deployment, run.deployment_id)
            assert deployment is not None
            deployment.status = DeploymentStatus.degraded.value
            deployment.updated_at = utc_now()
            session.add(deployment)
            for engine_id, view in generations.items():
                row = session.get(Engine, engine_id)
                if row is not None and view["generation"] is not None:
                    row.generation = int(view["generation"])
                    rank = view["rank"]
                    row.dp_rank = int(rank) if rank is not None else None
                    row.state = str(view["state"])
                    row.updated_at = utc_now()
                    session.add(row)

        await self.move(
            run,
            S.failed,
            message=f"switch failed part-way: {failure.error['message']}; deployment degraded",
            changes={
                "error": failure.error,
                "engine_results": results,
                "downtime_ms": downtime.downtime_ms,
                "downtime": {**downtime.as_dict(), "coordinator": run.commit_timing_ms()},
            },
            also=degrade,
        )

    async def finish(self, run: JobRun) -> None:
        """Every participant switched: record the new generation, release leavers, succeed."""
        plan = run.plan
        assert plan is not None
        downtime = self.downtime_of(run)

        def commit(session: Session) -> None:
            self.apply_generation(session, run.deployment_id, plan)

        if run.state == S.committing:
            await self.move(
                run,
                S.cleaning_up,
                message=f"generation {plan.generation} serving on {plan.to_size} engines; "
                f"downtime {downtime.downtime_ms:.1f} ms",
                changes={
                    "downtime_ms": downtime.downtime_ms,
                    "downtime": {**downtime.as_dict(), "coordinator": run.commit_timing_ms()},
                    "engine_results": self.engine_results(run),
                    "to_generation": plan.generation,
                },
                also=commit,
            )
        await self.progress(run, "cleaning_up")
        await self.test_hang("cleaning_up")
        leavers = [
            EngineHandle(engine_id=m.engine_id, url=m.url)
            for m in plan.old_members
            if m.engine_id in plan.leavers
        ]
        if leavers:
            launcher = self.launchers.get(run.launcher_name)
            if launcher is not None:
                try:
                    gone = await launcher.release(self.launch_spec(run), leavers)
                except Exception:
                    log.exception("job %s: releasing leavers failed", run.job_id)
                    gone = []
                if gone:
                    await self._db(lambda s: self._mark_left(s, gone))
        cleanup_state = CleanupState.pending if plan.old_members else CleanupState.none
        await self.move(
            run,
            S.succeeded,
            message="done" if not plan.old_members else "done; retired groups are being destroyed",
            changes={
                "progress_step": "done",
                "progress_percent": 100.0,
                "cleanup_state": cleanup_state.value,
                "cleanup": {"retired_generation": plan.old_generation, "engines": plan.staying + plan.leavers}
                if plan.old_members
                else None,
            },
        )

    # --- database pieces of a job -----------------------------------------------------------------

    def _deployment_and_engines(self, session: Session, run: JobRun) -> tuple[Deployment, list[Engine]]:
        deployment = session.get(Deployment, run.deployment_id)
        assert deployment is not None
        rows = session.exec(
            select(Engine).where(
                Engine.deployment_id == run.deployment_id, Engine.state != EngineState.left.value
            )
        ).all()
        return deployment, list(rows)

    def _target(self, session: Session, run: JobRun) -> int:
        job = session.get(ReconfigurationJob, run.job_id)
        assert job is not None
        return job.to_dp_size

    async def _agent_infos(
        self, run: JobRun, fleet: Fleet, deployment: Deployment, rows: Sequence[Engine]
    ) -> list[AgentInfo]:
        """Every known engine's `/v1/info`. A current member that does not answer fails the job; an
        idle engine that does not answer is skipped."""
        clients = [fleet.client(row.id, row.url) for row in rows]
        results = await fleet.each(clients, lambda c: c.info())
        infos: list[AgentInfo] = []
        for row in rows:
            result = results[row.id]
            if isinstance(result, AgentCallError):
                is_member = (
                    row.dp_rank is not None
                    and row.generation == deployment.generation
                    and row.state
                    in (
                        EngineState.serving.value,
                        EngineState.paused.value,
                    )
                )
                if is_member and deployment.generation > 0:
                    raise JobFailure.from_exception("preparing", result)
                continue
            infos.append(result)
        return infos

    def _upsert_engines(self, session: Session, run: JobRun, infos: Sequence[AgentInfo]) -> None:
        """Engines the launcher just started may not have registered yet: record them now."""
        for info in infos:
            if session.get(Engine, info.engine_id) is not None:
                continue
            session.add(
                Engine(
                    id=info.engine_id,
                    deployment_id=run.deployment_id,
                    url=info.url,
                    platform=info.platform.value,
                    device=info.device,
                    state=EngineState.idle.value,
                    launched_by=run.launcher_name,
                )
            )
            try:
                session.commit()
            except IntegrityError:
                session.rollback()  # it registered itself meanwhile

    def _mark_left(self, session: Session, engine_ids: Sequence[str]) -> None:
        for engine_id in engine_ids:
            row = session.get(Engine, engine_id)
            if row is not None:
                row.state = EngineState.left.value
                row.dp_rank = None
                row.updated_at = utc_now()
                session.add(row)
        session.commit()

    @staticmethod
    def apply_generation(session: Session, deployment_id: str, plan: Plan) -> None:
        """The deployment and its engines as the new generation: size, generation, ranks, states."""
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None
        now = utc_now()
        deployment.current_dp_size = plan.to_size
        deployment.generation = plan.generation
        deployment.status = DeploymentStatus.ready.value
        deployment.updated_at = now
        session.add(deployment)
        for rank, member in enumerate(plan.members):
            row = session.get(Engine, member.engine_id)
            if row is None:
                continue
            row.dp_rank = rank
            row.world_size = plan.to_size
            row.generation = plan.generation
            row.state = EngineState.serving.value
            row.updated_at = now
            session.add(row)
        for engine_id in plan.leavers:
            row = session.get(Engine, engine_id)
            if row is None:
                continue
            row.dp_rank = None
            row.world_size = 0
            row.state = EngineState.idle.value
            row.updated_at = now
            session.add(row)
        session.flush()


def role_of(plan: Plan, engine_id: str) -> Role:
    return plan.role(engine_id)
