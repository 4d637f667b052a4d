"""What holds every autoscaler intent of a deployment back before any rule: an active job, or the
cooldown (`autoscale_cooldown_s`, counted from the deployment's newest job of any source, operator
scaling included); and what a relative step counts from. HTTP-free."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationJob
from app.jobs.service import active_job


@dataclass(frozen=True)
class Blocker:
    """Why no job can start now: `active-job` or `cooldown`, in words, and until when if known."""

    code: str
    reason: str
    until: datetime | None = None


def newest_job(session: Session, deployment: Deployment) -> ReconfigurationJob | None:
    return session.exec(
        select(ReconfigurationJob)
        .where(col(ReconfigurationJob.deployment_id) == deployment.id)
        .order_by(col(ReconfigurationJob.created_at).desc(), col(ReconfigurationJob.id).desc())
        .limit(1)
    ).first()


def next_scale_at(session: Session, deployment: Deployment) -> datetime | None:
    """When the cooldown after the newest job (of any source) ends; None when there is none."""
    last = newest_job(session, deployment)
    if last is None or deployment.autoscale_cooldown_s <= 0:
        return None
    return (last.finished_at or last.created_at) + timedelta(seconds=deployment.autoscale_cooldown_s)


def blocker(session: Session, deployment: Deployment, now: datetime) -> Blocker | None:
    running = active_job(session, deployment_id=deployment.id)
    if running is not None:
        return Blocker("active-job", f"reconfiguration {running.id} is still {running.state}")
    until = next_scale_at(session, deployment)
    if until is not None and until > now:
        last = newest_job(session, deployment)
        left = (until - now).total_seconds()
        return Blocker(
            "cooldown",
            f"cooldown: {left:.0f} s of {deployment.autoscale_cooldown_s:g} s left since job "
            f"{last.id if last else '?'} (next scale at {until.isoformat(timespec='seconds')})",
            until,
        )
    return None


def base_size(session: Session, deployment: Deployment) -> int:
    """What a relative step counts from: an active job's target, else the current size (two steps
    must not stack on a job that is still running)."""
    running = active_job(session, deployment_id=deployment.id)
    return running.to_dp_size if running is not None else deployment.current_dp_size
