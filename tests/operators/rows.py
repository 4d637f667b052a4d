"""Rows written straight into the database, and transitions driven with the state machine's own
function: lets the operators' tests produce job events without agents or a runner."""

from __future__ import annotations

import itertools

from sqlmodel import Session

from app.core.ids import new_id
from app.deployments.models import Deployment
from app.jobs.models import JOB_ID_PREFIX, ReconfigurationJob
from app.jobs.states import JobState
from app.jobs.transitions import transition

HAPPY_PATH: tuple[JobState, ...] = (
    JobState.pending,
    JobState.preparing,
    JobState.syncing,
    JobState.committing,
    JobState.cleaning_up,
    JobState.succeeded,
)


def make_deployment(
    session: Session,
    name: str,
    *,
    current: int = 2,
    min_size: int = 1,
    max_size: int = 8,
    cooldown_s: float = 60.0,
) -> Deployment:
    row = Deployment(
        id=new_id("dep"),
        name=name,
        engine_config={},
        min_dp_size=min_size,
        max_dp_size=max_size,
        warmup_policy="auto",
        strategy="background",
        launcher="static",
        current_dp_size=current,
        generation=1,
        autoscale_cooldown_s=cooldown_s,
    )
    session.add(row)
    session.commit()
    return row


def make_job(session: Session, deployment_id: str, *, to_size: int = 3) -> ReconfigurationJob:
    row = ReconfigurationJob(
        id=new_id(JOB_ID_PREFIX),
        deployment_id=deployment_id,
        from_dp_size=2,
        to_dp_size=to_size,
        from_generation=1,
        to_generation=2,
        requested_by="api",
        warmup_policy_requested="auto",
        strategy="background",
    )
    session.add(row)
    session.commit()
    return row


def advance(session: Session, job_id: str, *states: JobState) -> None:
    """Walk a job through `states` (the first is where it is now)."""
    for before, after in itertools.pairwise(states):
        transition(session, job_id=job_id, from_state=before, to_state=after, message=f"{before} -> {after}")


def run_to_success(session: Session, job_id: str) -> None:
    advance(session, job_id, *HAPPY_PATH)
