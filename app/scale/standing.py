"""A standing target (issue 38, partial growth): a grow that reached only part of its size leaves the
rest standing, and a later job (`requested_by: standing-target`) completes it when capacity appears.
HTTP-free.

The rule reads the jobs alone (no state of its own to keep in step): the deployment's newest job that
moved its size (neither a completion attempt nor a self-heal, which keep the size) decides. Succeeded
short of its `to_dp_size` while the deployment is still below it: that size stands. Any later job
that sets a size (an operator's, an autoscaler intent's, a `/scale` write's) replaces it, and a
completion attempt that reaches nothing more (failed) leaves it standing for the next try.

When to try again: a static pool shows its capacity (an idle registered engine: try at once); other
launchers cannot tell before they try, so the next attempt waits `retry_s` after the last one ended.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import DomainError
from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment, DeploymentStatus, DesiredSize, LauncherKind
from app.jobs.active import active_job_id
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import create_reconfiguration
from app.jobs.states import JobState

log = logging.getLogger(__name__)

# Jobs that keep the size they found: they neither set nor end a standing target.
KEEPS_SIZE = (RequestSource.standing_target.value, RequestSource.self_heal.value)


@dataclass(frozen=True)
class JobSeen:
    """What the rule reads of one job."""

    id: str
    requested_by: str
    state: str
    to_dp_size: int
    reached_dp_size: int | None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class Standing:
    target: int
    job_id: str  # the partial job that set it
    reached: int  # what that job reached


def standing_target(jobs: Sequence[JobSeen], current: int) -> Standing | None:
    """The size that stands, from the deployment's jobs newest first and its current size."""
    for job in jobs:
        if job.requested_by in KEEPS_SIZE:
            continue
        short = job.reached_dp_size is not None and job.reached_dp_size < job.to_dp_size
        if job.state != JobState.succeeded.value or not short or current >= job.to_dp_size:
            return None
        assert job.reached_dp_size is not None
        return Standing(target=job.to_dp_size, job_id=job.id, reached=job.reached_dp_size)
    return None


def due(jobs: Sequence[JobSeen], *, static: bool, idle_engines: int, now: datetime, retry_s: float) -> bool:
    """Whether to start a completion job now (no job active): a static pool with an idle engine at
    once; otherwise `retry_s` after the newest job ended."""
    if static:
        return idle_engines > 0
    ended = jobs[0].finished_at if jobs else None
    return ended is None or now >= ended + timedelta(seconds=retry_s)


def _seen(job: ReconfigurationJob) -> JobSeen:
    return JobSeen(job.id, job.requested_by, job.state, job.to_dp_size, job.reached_dp_size, job.finished_at)


def recent_jobs(session: Session, deployment_id: str, limit: int = 50) -> list[JobSeen]:
    rows = session.exec(
        select(ReconfigurationJob)
        .where(col(ReconfigurationJob.deployment_id) == deployment_id)
        .order_by(col(ReconfigurationJob.created_at).desc(), col(ReconfigurationJob.id).desc())
        .limit(limit)
    ).all()
    return [_seen(j) for j in rows]


def of(session: Session, deployment: Deployment) -> Standing | None:
    """The deployment's standing target, if any (what `desired` shows)."""
    return standing_target(recent_jobs(session, deployment.id), deployment.current_dp_size)


def candidates(session: Session, among: Sequence[str] | None = None) -> list[str]:
    """Deployments below the size of a job that succeeded short of it (few: those end as they
    complete), of `among` if given; one query."""
    query = (
        select(ReconfigurationJob.deployment_id)
        .join(Deployment, col(Deployment.id) == col(ReconfigurationJob.deployment_id))
        .where(
            col(ReconfigurationJob.state) == JobState.succeeded.value,
            col(ReconfigurationJob.reached_dp_size) < col(ReconfigurationJob.to_dp_size),
            col(Deployment.current_dp_size) < col(ReconfigurationJob.to_dp_size),
        )
    )
    if among is not None:
        query = query.where(col(ReconfigurationJob.deployment_id).in_(list(among)))
    return sorted(set(session.exec(query).all()))


def shown(session: Session, deployment: Deployment, desired: DesiredSize) -> DesiredSize:
    """The deployment's desired size with its standing target: the size it keeps wanting while no
    intent asks for another (`dp_size`, source `standing-target`)."""
    found = of(session, deployment)
    if found is None:
        return desired
    update: dict[str, object] = {"standing_target": found.target, "standing_target_job_id": found.job_id}
    if desired.dp_size is None:
        update |= {
            "dp_size": found.target,
            "source": RequestSource.standing_target.value,
            "reason": f"job {found.job_id} reached {found.reached} of {found.target}: the rest stands",
        }
    return desired.model_copy(update=update)


def complete(session: Session, *, retry_s: float, now: datetime | None = None) -> list[ReconfigurationJob]:
    """Start the jobs that complete standing targets, where due; the jobs started."""
    now = now or utc_now()
    started = []
    for deployment_id in candidates(session):
        deployment = session.get(Deployment, deployment_id)
        if deployment is None or deployment.status == DeploymentStatus.stopped.value:
            continue
        if active_job_id(session, deployment_id=deployment.id) is not None:
            continue
        jobs = recent_jobs(session, deployment.id)
        standing = standing_target(jobs, deployment.current_dp_size)
        if standing is None:
            continue
        idle = session.exec(
            select(Engine.id).where(
                col(Engine.deployment_id) == deployment.id,
                col(Engine.state).in_([EngineState.idle.value, EngineState.registered.value]),
            )
        ).all()
        static = deployment.launcher == LauncherKind.static.value
        if not due(jobs, static=static, idle_engines=len(idle), now=now, retry_s=retry_s):
            continue
        request = ReconfigurationCreate(
            deployment=deployment.name,
            target_dp_size=standing.target,
            reason=f"standing target {standing.target} (job {standing.job_id} reached {standing.reached})",
        )
        try:
            job = create_reconfiguration(
                session, request=request, requested_by=RequestSource.standing_target
            ).job
        except DomainError as exc:
            session.rollback()
            log.info("standing target of %s not acted on yet: %s", deployment.name, exc.detail)
            continue
        log.info("standing target: %s -> %d (job %s)", deployment.name, job.to_dp_size, job.id)
        started.append(job)
    return started
