"""A deployment's *desired* DP size: what autoscalers asked for, reconciled level-triggered. HTTP-free.

Autoscaler requests (the hooks, Alertmanager, the `/scale` PUT) set the desired size with who asked
and why (`set_desired`), then act at once if nothing blocks (`blocker`). A request refused for an
active job or the cooldown is not lost: the runner's `desired-size` task (`reconcile`) starts the job
once nothing blocks it, without a repeat from the autoscaler.

- The cooldown counts from the deployment's newest job of any source (operator scaling included), so
  two alerts cannot move the size twice within one cooldown: the newest request wins, once.
- A desire is *pending* while it differs from the current size and no job was created since it was
  set. A job created afterwards (the one it started, or an operator's, which supersedes it) consumes
  it: a job that rolls back is not retried in a loop; the autoscaler's next request asks again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import DomainError
from app.deployments.models import Deployment, DesiredSize
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import active_job, create_reconfiguration

log = logging.getLogger(__name__)

SCALE_SUBRESOURCE = "scale-subresource"


@dataclass(frozen=True)
class Blocker:
    """Why a job cannot start now: `active-job` or `cooldown`, in words, and until when if known."""

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
    """What a relative step counts from: an active job's target, else the current size (two steps of
    one episode must not stack on a job that is still running)."""
    running = active_job(session, deployment_id=deployment.id)
    return running.to_dp_size if running is not None else deployment.current_dp_size


def set_desired(
    deployment: Deployment,
    *,
    size: int,
    source: str,
    requester: str | None,
    reason: str,
    now: datetime,
) -> None:
    """Record the request on the row (the caller commits it with its own record)."""
    deployment.desired_dp_size = size
    deployment.desired_source = source[:32]
    deployment.desired_requester = requester[:128] if requester else None
    deployment.desired_reason = reason[:1000]
    deployment.desired_at = now


def is_pending(session: Session, deployment: Deployment) -> bool:
    if deployment.desired_dp_size is None or deployment.desired_at is None:
        return False
    if deployment.desired_dp_size == deployment.current_dp_size:
        return False
    consumed = session.exec(
        select(ReconfigurationJob.id)
        .where(
            col(ReconfigurationJob.deployment_id) == deployment.id,
            col(ReconfigurationJob.created_at) >= deployment.desired_at,
        )
        .limit(1)
    ).first()
    return consumed is None


def desired_public(session: Session, deployment: Deployment, now: datetime | None = None) -> DesiredSize:
    now = now or utc_now()
    pending = is_pending(session, deployment)
    blocked = blocker(session, deployment, now) if pending else None
    # While a job runs, the cooldown has not started: it counts from that job's end.
    running = active_job(session, deployment_id=deployment.id) is not None
    until = None if running else next_scale_at(session, deployment)
    return DesiredSize(
        dp_size=deployment.desired_dp_size,
        source=deployment.desired_source,
        requester=deployment.desired_requester,
        reason=deployment.desired_reason,
        requested_at=deployment.desired_at,
        pending=pending,
        blocked_by=blocked.code if blocked else None,
        next_scale_at=until if until is not None and until > now else None,
    )


def start_job(
    session: Session,
    deployment: Deployment,
    *,
    target: int,
    source: str,
    requester: str | None,
    reason: str,
    on_created: Callable[[Session, ReconfigurationJob], None] | None = None,
) -> ReconfigurationJob:
    """Create the job that moves the deployment to `target` (every rule of the API applies; raises its
    DomainError)."""
    requested_by = (
        RequestSource.scale_subresource if source == SCALE_SUBRESOURCE else RequestSource.autoscaler
    )
    outcome = create_reconfiguration(
        session,
        request=ReconfigurationCreate(
            deployment=deployment.name, target_dp_size=target, reason=reason[:1000]
        ),
        requested_by=requested_by,
        requester=requester,
        on_created=on_created,
    )
    return outcome.job


def reconcile_one(session: Session, deployment: Deployment, now: datetime) -> ReconfigurationJob | None:
    """Start the job a pending desire asks for, if nothing blocks it now."""
    if not is_pending(session, deployment) or blocker(session, deployment, now) is not None:
        return None
    assert deployment.desired_dp_size is not None
    target = min(max(deployment.desired_dp_size, deployment.min_dp_size), deployment.max_dp_size)
    if target == deployment.current_dp_size:
        return None
    try:
        return start_job(
            session,
            deployment,
            target=target,
            source=deployment.desired_source or "autoscaler",
            requester=deployment.desired_requester,
            reason=f"desired size {target} ({deployment.desired_source}: {deployment.desired_reason})",
        )
    except DomainError as exc:  # e.g. an unresolved cleanup failure, or another coordinator won
        session.rollback()
        log.info("desired size of %s not acted on yet: %s", deployment.name, exc.detail)
        return None


def reconcile(session: Session, now: datetime | None = None) -> list[ReconfigurationJob]:
    """One pass over the deployments with a desire: the jobs it started."""
    now = now or utc_now()
    names = session.exec(
        select(Deployment.name)
        .where(col(Deployment.desired_dp_size).is_not(None))
        .order_by(col(Deployment.name))
    ).all()
    started = []
    for name in names:
        deployment = session.exec(select(Deployment).where(col(Deployment.name) == name)).first()
        if deployment is None:
            continue
        job = reconcile_one(session, deployment, now)
        if job is not None:
            log.info("desired size: %s %d -> %d (job %s)", name, job.from_dp_size, job.to_dp_size, job.id)
            started.append(job)
    return started
