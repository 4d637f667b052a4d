"""The seam between the runner and the engines it drives: one `Backend` per kind of engine a deployment
fronts (`Deployment.backend`), the failures every backend's flow stops on, and the registry through which
the runner and the API reach a backend.

- `reference` (`app.backends.reference`): epctl's own agents, driven call by call through the protocol
  (prepare, sync, commit, cleanup);
- `vllm` (`app.backends.vllm`): a vLLM API server's own elastic EP endpoint.

The runner (`app.runner`) claims jobs and hands each to its deployment's backend (`Backends.run`,
`Backends.reconcile`), ticks every backend's periodic work beside its own, and never names a backend;
the deployments API tells the backends a deployment came or went (`app.deployments.reactions`).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.agents.fleet import Fleet
from app.core.errors import DomainError
from app.core.faults import EngineFault
from app.core.runner_settings import RunnerSettings
from app.deployments.models import Deployment, EngineBackend
from app.jobs.async_record import AsyncJobRecord, RunningJob, WorkerSessions
from app.jobs.models import JobError, ReconfigurationJob
from app.jobs.states import JobState
from app.launchers.base import DeletedDeployment, EnginesToRestart, Launcher
from engine_agent.protocol import DowntimeOverrun

J = TypeVar("J", bound=RunningJob)
log = logging.getLogger(__name__)

# --- the failures every flow stops on -------------------------------------------------------------------


class JobFailure(Exception):
    """Ends a job; `error` is what the job records (phase, engine, type, message; the overrun of a
    downtime budget). A backend may add what its ending needs (the vLLM flow: the end state)."""

    def __init__(
        self,
        phase: str,
        type_: str,
        message: str,
        engine_id: str | None = None,
        overrun: DowntimeOverrun | None = None,
    ) -> None:
        super().__init__(message)
        given = {"overrun": overrun} if overrun is not None else {}
        self.error = JobError(phase=phase, engine_id=engine_id, type=type_, message=message, **given)

    @classmethod
    def from_exception(cls, phase: str, exc: BaseException) -> JobFailure:
        if isinstance(exc, JobFailure):
            return exc
        if isinstance(exc, EngineFault):  # an agent call, a launch, a plan: type, message, engine
            return cls(phase, exc.type, exc.message, exc.engine_id)
        if isinstance(exc, DomainError):
            return cls(phase, exc.code, exc.detail)
        return cls(phase, "internal-error", f"{exc.__class__.__name__}: {exc}")


# What a step may fail with by design (an engine, a launcher, the planner, a refused record change): the
# job records it; anything else is a bug, recorded as `internal-error` and logged with its traceback.
EXPECTED_FAILURES = (JobFailure, EngineFault, DomainError)


class JobCancelled(JobFailure):
    """A cancel was requested (and is honoured) while the job was in `phase`."""

    def __init__(self, phase: str) -> None:
        super().__init__(phase, "cancelled", "cancelled on request")


class JobMovedOn(Exception):
    """The job is no longer where this flow left it (another coordinator claimed it, an operator
    cancelled it while pending): not ours to touch any further. The runner drops the job on it."""


class FlowRecord(AsyncJobRecord[J]):
    """A backend's job record: a move the writer refuses raises `JobCancelled` (a pending cancel) or
    `JobMovedOn` (the job moved under the flow)."""

    async def start(self, job: J, message: str) -> bool:
        """A pending job's first move: `cancelled` when a cancel came before it started (False), else
        `preparing` with `message` (True: the flow goes on)."""
        if await self.cancel_requested(job):
            await self.move(
                job,
                JobState.cancelled,
                message="cancelled before it started",
                changes={"error": JobCancelled(JobState.pending.value).error},
            )
            return False
        await self.move(job, JobState.preparing, message=message)
        return True

    def cancelled(self, job: J) -> Exception:
        return JobCancelled(job.state.value)

    def moved_on(self, reason: str) -> Exception:
        return JobMovedOn(reason)


# --- what a backend does --------------------------------------------------------------------------------


@dataclass
class Periodic:
    """One periodic task of the runner's loop and how often it runs."""

    name: str
    interval_s: float
    run: Callable[[], Awaitable[Any]]
    last_run: float = field(default=float("-inf"))

    def due(self, now: float) -> bool:
        return now - self.last_run >= self.interval_s


@dataclass(frozen=True)
class BackendContext:
    """What the runner gives every backend: the database, its lease owner name, its settings, the
    launchers by name, the agent clients of one job (`new_fleet`) and the heartbeat timeout."""

    db: DbEngine
    owner: str
    settings: RunnerSettings
    launchers: Mapping[str, Launcher]
    new_fleet: Callable[[], Fleet]
    heartbeat_timeout_s: float = 15.0  # an engine silent this long is lost (`EPCTL_HEARTBEAT_TIMEOUT_S`)
    agent_timeout_s: float = 5.0  # one agent call's deadline (`EPCTL_AGENT_TIMEOUT_S`)


class Backend(ABC):
    """One kind of engine: runs its deployments' jobs, ends the jobs a dead coordinator left, and
    reacts to its deployments coming and going."""

    kind: ClassVar[EngineBackend]

    @abstractmethod
    async def run(self, job_id: str) -> None:
        """Drive a pending job this coordinator claimed to a terminal state (raising `JobMovedOn`
        when it is no longer ours)."""

    @abstractmethod
    async def reconcile(self, job_id: str) -> None:
        """Finish or roll back a job whose coordinator died, from what the engines report."""

    async def deployment_created(self, name: str) -> None:
        """A deployment of this backend was just created."""
        return None

    async def deployment_deleted(self, deleted: DeletedDeployment) -> None:
        """A deployment of this backend was just deleted: stop what ran for it (best effort)."""
        return None

    async def restart_engines(self, restart: EnginesToRestart) -> list[str]:
        """Stop engines that refuse the coordinator's agent key (see `EnginesToRestart`); the ids stopped."""
        return []

    def group_broke(self, session: Session, deployment_id: str) -> None:
        """A member just reported its group broke: the deployment's status, in the heartbeat's
        transaction (see `app.deployments.reactions`). Nothing by default."""
        return None

    def periodic(self) -> Sequence[Periodic]:
        """Work the runner's loop ticks for this backend."""
        return ()

    async def start(self) -> None:
        """The runner starts (its loop runs from now on): begin what runs beside it."""
        return None

    async def stop(self) -> None:
        """The runner stops: end what `start` began."""
        return None


def backend_of_job(session: Session, job_id: str) -> str:
    """The `backend` of the deployment `job_id` belongs to."""
    backend = session.exec(
        select(Deployment.backend)
        .join(ReconfigurationJob, ReconfigurationJob.deployment_id == Deployment.id)  # type: ignore[arg-type]
        .where(ReconfigurationJob.id == job_id)
    ).first()
    return backend or EngineBackend.reference.value


class Backends:
    """The backends by kind: the one place that picks a backend by a deployment's `backend`."""

    def __init__(self, db: DbEngine, backends: Iterable[Backend]) -> None:
        self.sessions = WorkerSessions(db)
        self.by_kind: dict[str, Backend] = {backend.kind.value: backend for backend in backends}

    def __getitem__(self, kind: str) -> Backend:
        return self.by_kind[EngineBackend(kind).value]

    async def of_job(self, job_id: str) -> Backend:
        return self[await self.sessions.run_in_session(lambda s: backend_of_job(s, job_id))]

    async def run(self, job_id: str) -> None:
        await (await self.of_job(job_id)).run(job_id)

    async def reconcile(self, job_id: str) -> None:
        await (await self.of_job(job_id)).reconcile(job_id)

    async def deployment_created(self, name: str, backend: str) -> None:
        if (found := self.by_kind.get(backend)) is not None:
            await found.deployment_created(name)

    async def deployment_deleted(self, deleted: DeletedDeployment) -> None:
        if (found := self.by_kind.get(deleted.backend)) is not None:
            await found.deployment_deleted(deleted)

    async def restart_engines(self, restart: EnginesToRestart) -> list[str]:
        found = self.by_kind.get(restart.backend)
        return await found.restart_engines(restart) if found is not None else []

    def group_broke(self, session: Session, deployment_id: str) -> None:
        # Only epctl's own agents heartbeat (a registration with another backend's deployment is refused).
        if (found := self.by_kind.get(EngineBackend.reference.value)) is not None:
            found.group_broke(session, deployment_id)

    def periodic(self) -> list[Periodic]:
        return [task for backend in self.by_kind.values() for task in backend.periodic()]

    async def start(self) -> None:
        for backend in self.by_kind.values():
            await backend.start()

    async def stop(self) -> None:
        for backend in self.by_kind.values():
            try:
                await backend.stop()
            except Exception:
                log.exception("backend %s: stopping failed", backend.kind.value)
