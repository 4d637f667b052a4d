"""Everything a running job writes: its transitions and notes (through `app.jobs.transitions`), and the
deployment and engine rows a job changes (new generation, degraded, engines launched or gone).

Database work runs in worker threads (sync sessions) so the event loop keeps driving agents.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlmodel import Session, col, select

from app.backends.base import FlowRecord, JobMovedOn
from app.backends.reference.job import JobRun, progress_percent
from app.backends.reference.liveness.health import REASON_GENERATION_SPLIT
from app.backends.reference.planner import Plan
from app.core.clock import utc_now
from app.core.errors import ConflictError
from app.deployments.agent_keys import agent_keys_of, previous_until_epoch
from app.deployments.engines.models import SERVING_STATES, Engine, EngineState
from app.deployments.engines.service import record_launched
from app.deployments.models import Deployment, DeploymentStatus, StatusDetail
from app.deployments.status import set_status
from app.jobs import incident_outage
from app.jobs.models import ReconfigurationJob
from app.jobs.states import JobState
from app.jobs.transitions import append_event
from engine_agent.protocol import AgentInfo, CommitMode, EngineConfig, Strategy

# An engine row in one of these states, on the deployment's generation with a rank, is a member: if
# its agent does not answer, the job cannot plan (an `unreachable` member is still a member).
MEMBER_STATES = frozenset(
    {EngineState.serving.value, EngineState.paused.value, EngineState.unreachable.value}
)


class JobRecord(FlowRecord[JobRun]):
    """The writes of running jobs, on one database. A refused move raises `JobCancelled` (a pending
    cancel) or `JobMovedOn` (the job moved under us, e.g. an operator cancelled it)."""

    # --- the job ----------------------------------------------------------------------------------

    async def load(self, job_id: str) -> JobRun:
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
                commit_mode=CommitMode(job.commit_mode),
                max_downtime_ms=job.max_downtime_ms,
                retire=tuple(job.retire or ()),
                all_or_nothing=job.all_or_nothing,
                agent_keys=agent_keys_of(deployment),
                agent_key_previous_until=previous_until_epoch(deployment),
                launch_timeout_s=deployment.launch_timeout_s,
            )

        return await self.run_in_session(load)

    async def job(self, job_id: str) -> ReconfigurationJob:
        def read(session: Session) -> ReconfigurationJob:
            job = session.get(ReconfigurationJob, job_id)
            if job is None:
                raise LookupError(job_id)
            return job

        return await self.run_in_session(read)

    async def with_shared_outage(
        self, run: JobRun, changes: dict[str, Any], message: str
    ) -> tuple[dict[str, Any], str]:
        """The probe's changes and line, with a measured incident's client outage when this job shares
        it (it is that loss's recovery): the job and its incident agree (the incident's counts from the
        loss; this job's canaries only from its start)."""
        shared = await self.run_in_session(
            lambda session: incident_outage.outage_for_job(session, run.job_id)
        )
        if shared is None:
            return changes, message
        incident_id, outage_ms = shared
        line = f"{message}; client outage {outage_ms:.1f} ms from the loss (incident {incident_id})"
        return {**changes, "client_outage_ms": outage_ms}, line

    async def record_probe(self, run: JobRun, changes: dict[str, Any], message: str) -> None:
        """The probe's figures onto the job (`with_shared_outage`), then a second look: an incident
        measured between that read and this write put its figure on the job before ours landed, so
        once ours is committed the job takes the incident's again. Either that look sees the incident
        measured, or the incident's own write to its jobs comes after ours: job and incident agree."""
        changes, message = await self.with_shared_outage(run, changes, message)
        await self.note(run, "probe", message, changes=changes)
        shared = await self.run_in_session(
            lambda session: incident_outage.outage_for_job(session, run.job_id)
        )
        if shared is not None and shared[1] != changes.get("client_outage_ms"):
            incident_id, outage_ms = shared
            await self.note(
                run,
                "outage",
                f"client outage {outage_ms:.1f} ms from the loss (incident {incident_id}, measured "
                "while this job recorded its probe)",
                changes={"client_outage_ms": outage_ms},
            )

    async def note(
        self,
        run: JobRun,
        kind: str,
        message: str | None = None,
        *,
        data: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
    ) -> None:
        """A log row, only while the job is still in the state this run left it in: a holder frozen
        past its lease, whose job another coordinator moved on meanwhile, writes nothing (`JobMovedOn`)."""
        try:
            await self.run_in_session(
                lambda s: append_event(
                    s,
                    job_id=run.job_id,
                    kind=kind,
                    message=message,
                    data=data,
                    changes=changes,
                    expected_states={run.state},
                )
            )
        except ConflictError as exc:
            raise JobMovedOn(str(exc)) from exc

    async def progress(self, run: JobRun, step: str, fraction: float = 0.0) -> None:
        """Record progress (an event per new step, or per 10% within one)."""
        percent = progress_percent(step, fraction)
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

    # --- the deployment and its engines -----------------------------------------------------------

    async def deployment_and_engines(self, run: JobRun) -> tuple[Deployment, list[Engine], int]:
        """The deployment, the engines a job may use (not `left`, not `fenced`: a fenced engine takes part
        again only once it heartbeats back), and the job's target size."""

        def read(session: Session) -> tuple[Deployment, list[Engine], int]:
            deployment = session.get(Deployment, run.deployment_id)
            job = session.get(ReconfigurationJob, run.job_id)
            assert deployment is not None and job is not None
            rows = session.exec(
                select(Engine).where(
                    Engine.deployment_id == run.deployment_id,
                    col(Engine.state).not_in([EngineState.left.value, EngineState.fenced.value]),
                )
            ).all()
            return deployment, list(rows), job.to_dp_size

        return await self.run_in_session(read)

    async def add_engines(self, run: JobRun, infos: Sequence[AgentInfo]) -> None:
        """Engines the launcher just started may not have registered yet: record them now."""

        def add(session: Session) -> None:
            record_launched(session, run.deployment_id, run.launcher_name, infos)

        await self.run_in_session(add)

    async def mark_left(self, engine_ids: Sequence[str]) -> None:
        def mark(session: Session) -> None:
            for engine_id in engine_ids:
                row = session.get(Engine, engine_id)
                if row is not None:
                    row.state = EngineState.left.value
                    row.dp_rank = None
                    row.updated_at = utc_now()
                    session.add(row)
            session.commit()

        await self.run_in_session(mark)


def apply_generation(session: Session, deployment_id: str, plan: Plan) -> None:
    """The deployment and its engines as the new generation: size, generation, ranks, states (in the
    caller's transaction)."""
    deployment = session.get(Deployment, deployment_id)
    assert deployment is not None
    now = utc_now()
    deployment.current_dp_size = plan.to_size
    deployment.generation = plan.generation
    deployment.coverage = (
        {**plan.coverage, "generation": plan.generation, "since": now.isoformat()} if plan.coverage else None
    )
    deployment.updated_at = now
    session.add(deployment)
    # Serving on the new generation: a degraded deployment recovers here (its incident resolves).
    set_status(session, deployment, DeploymentStatus.ready, serving=plan.to_size, now=now)
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


def degrade(
    session: Session,
    deployment_id: str,
    generations: Mapping[str, Mapping[str, Any]],
    job_id: str | None = None,
) -> None:
    """A switch that failed part-way: the deployment `degraded` with the reason (which engine is on
    which generation) and announced, each engine row on the generation, rank and state its agent
    reports (in the caller's transaction). The heartbeat pass keeps the reason true from then on."""
    deployment = session.get(Deployment, deployment_id)
    assert deployment is not None
    for engine_id, view in generations.items():
        row = session.get(Engine, engine_id)
        if row is not None and view["generation"] is not None:
            row.generation = int(view["generation"])
            rank = view["rank"]
            row.dp_rank = int(rank) if rank is not None else None
            row.state = str(view["state"])
            row.updated_at = utc_now()
            session.add(row)
    by_generation: dict[str, list[str]] = {}
    for engine_id, view in sorted(generations.items()):
        generation = view["generation"]
        by_generation.setdefault("unknown" if generation is None else str(generation), []).append(engine_id)
    where = "; ".join(f"generation {g}: {', '.join(ids)}" for g, ids in sorted(by_generation.items()))
    detail = StatusDetail(
        reason=REASON_GENERATION_SPLIT,
        message=f"a switch failed part-way ({where}); the record stays on generation {deployment.generation}",
        hint="scale the deployment to form a new generation on the engines that serve",
        since=utc_now(),
        job_id=job_id,
    )
    serving = sum(
        1
        for view in generations.values()
        if view["generation"] == deployment.generation and view["state"] in SERVING_STATES
    )
    # Announced even over an earlier degraded reason: a job's verdict the operator must see.
    set_status(session, deployment, DeploymentStatus.degraded, detail, serving=serving, announce_again=True)


def is_member_row(row: Engine, deployment: Deployment) -> bool:
    """Whether the record says this engine serves the deployment's current generation."""
    return row.dp_rank is not None and row.generation == deployment.generation and row.state in MEMBER_STATES
