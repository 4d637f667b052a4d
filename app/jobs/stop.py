"""A deployment whose engines were stopped on purpose (`epctl up` stopping, `epctl down`): its record says
`stopped`, with the size it had, and no job of it is left running.

`epctl up` stops its engines when it exits and `epctl down` stops a crashed run's; either way no engine of
the deployment is left, so a job still open on it can never finish: it ends here (`END_ON_STOP`). The
size to bring back is the one the deployment was meant to have: a self-heal that was growing it back
aims at the size before the loss (`heal_target_dp_size`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment, DeploymentStatus, StatusDetail
from app.deployments.status import set_status
from app.jobs.models import ReconfigurationJob
from app.jobs.states import ACTIVE_STATES, JobState
from app.jobs.transitions import transition

REASON_STOPPED = "stopped"

S = JobState

# How a job still open when its deployment's engines stop ends: before the commit nothing changed
# (cancelled); inside the commit the engines stopped mid-switch (failed); cleaning up, the switch is done.
END_ON_STOP: Mapping[JobState, JobState] = {
    S.pending: S.cancelled,
    S.preparing: S.cancelled,
    S.syncing: S.cancelled,
    S.committing: S.failed,
    S.cleaning_up: S.succeeded,
}


def size_to_bring_back(current: int, heal_target: int | None, stopped_before: int | None) -> int | None:
    """The size a stopped deployment had: what it was meant to run at when stopped (a grow-back's
    target, else its size), or, already stopped at size 0, what the earlier stop kept; None: never ran."""
    if current > 0:
        return max(current, heal_target or 0)
    return stopped_before


@dataclass
class Stopped:
    deployment: str
    size: int | None  # the size it had (what a restart brings back)
    jobs_ended: dict[str, str] = field(default_factory=dict)  # job id -> the state it ended in


def record_stopped(session: Session, deployment: Deployment, *, by: str) -> Stopped | None:
    """Record `deployment` stopped by `by` (its engines are gone): open jobs ended, engines `left`,
    size 0 with the size it had kept, status `stopped`; commits. None when there was nothing to record."""
    rows = session.exec(
        select(Engine).where(Engine.deployment_id == deployment.id, Engine.state != EngineState.left.value)
    ).all()
    open_jobs = session.exec(
        select(ReconfigurationJob).where(
            ReconfigurationJob.deployment_id == deployment.id,
            col(ReconfigurationJob.state).in_([s.value for s in ACTIVE_STATES]),
        )
    ).all()
    already = deployment.status == DeploymentStatus.stopped.value
    if already and not rows and not open_jobs and deployment.current_dp_size == 0:
        return None
    stopped = Stopped(deployment.name, None)
    for job in open_jobs:
        state = JobState(job.state)
        ended = END_ON_STOP[state]
        transition(
            session,
            job_id=job.id,
            from_state=state,
            to_state=ended,
            message=f"the deployment's engines were stopped ({by}) with the job {state.value}",
        )
        stopped.jobs_ended[job.id] = ended.value
    session.refresh(deployment)
    now = utc_now()
    for row in rows:
        row.state, row.dp_rank, row.updated_at = EngineState.left.value, None, now
        session.add(row)
    size = size_to_bring_back(
        deployment.current_dp_size, deployment.heal_target_dp_size, deployment.stopped_dp_size
    )
    stopped.size = size
    deployment.current_dp_size = 0
    deployment.heal_lost, deployment.heal_target_dp_size, deployment.heal_loss_at = None, None, None
    deployment.updated_at = now
    had = f" at size {size}" if size else ""
    detail = StatusDetail(
        reason=REASON_STOPPED,
        message=f"its engines were stopped ({by}){had}",
        hint=f"`epctl up` on the same data directory brings it back{had}; or scale it",
        since=now,
    )
    set_status(session, deployment, DeploymentStatus.stopped, detail, serving=0, now=now)
    deployment.stopped_dp_size = size
    session.add(deployment)
    session.commit()
    return stopped
