"""A deployment's status: the one table of allowed moves and the one writer.

    ready    -> degraded   (a reason is required)   event deployment.degraded, an incident opens
    degraded -> degraded   (the reason changes)      no event; the incident's reason follows
    degraded -> ready      (no reason)               event deployment.recovered, the incident resolves
    ready    -> ready                                 nothing (a new generation is not a status change)
    ready, degraded -> stopped   (a reason)          its engines stopped on purpose; an open incident
                                                      ends (not served again: no recovery figure)
    stopped  -> ready      (no reason)               started again (a job formed a generation)
    stopped  -> degraded   (a reason)                started again and it failed part-way
    ready    -> adopting   (no reason)               a starting coordinator asks its members whether they
    adopting -> adopting                              still serve (`liveness.adoption`): not `ready` until
                                                      it knows; no event (nothing was lost yet)
    adopting -> ready      (no reason)               every member answered serving: no event
    adopting -> degraded   (a reason)                one did not: event deployment.degraded, an incident
    adopting -> stopped    (a reason)                its engines stopped on purpose meanwhile

Every writer (the job runner's switch and its failures, the heartbeat health pass, self-healing, the
stall fence, the vLLM backend) calls `set_status`, in its own transaction: the status, its detail, the
event and the incident commit together, so a reader never sees `degraded` without its reason and no
status change goes unannounced.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import Session

from app.core.clock import utc_now
from app.deployments.incidents import service as incidents
from app.deployments.models import Deployment, DeploymentStatus, StatusDetail
from app.webhooks.models import EventType
from app.webhooks.outbox import enqueue_event

# (from, to) -> whether it is announced; every other move (none today) is refused.
MOVES: dict[tuple[DeploymentStatus, DeploymentStatus], EventType | None] = {
    (DeploymentStatus.ready, DeploymentStatus.degraded): EventType.deployment_degraded,
    (DeploymentStatus.degraded, DeploymentStatus.degraded): None,
    (DeploymentStatus.degraded, DeploymentStatus.ready): EventType.deployment_recovered,
    (DeploymentStatus.ready, DeploymentStatus.ready): None,
    (DeploymentStatus.ready, DeploymentStatus.stopped): None,
    (DeploymentStatus.degraded, DeploymentStatus.stopped): None,
    (DeploymentStatus.stopped, DeploymentStatus.stopped): None,
    (DeploymentStatus.stopped, DeploymentStatus.ready): None,
    (DeploymentStatus.stopped, DeploymentStatus.degraded): EventType.deployment_degraded,
    (DeploymentStatus.ready, DeploymentStatus.adopting): None,
    (DeploymentStatus.adopting, DeploymentStatus.adopting): None,
    (DeploymentStatus.adopting, DeploymentStatus.ready): None,
    (DeploymentStatus.adopting, DeploymentStatus.degraded): EventType.deployment_degraded,
    (DeploymentStatus.adopting, DeploymentStatus.stopped): None,
}
# The statuses that say why (a `StatusDetail`); `ready` never carries one.
WITH_DETAIL = frozenset({DeploymentStatus.degraded, DeploymentStatus.stopped})


# What a starting coordinator's adoption asks about: a deployment that says it serves (`ready`), or one a
# coordinator that stopped mid-adoption left `adopting`. `degraded` and `stopped` already say what is known.
ADOPTED_FROM = frozenset({DeploymentStatus.ready, DeploymentStatus.adopting})


def adopting_from(status: DeploymentStatus | str) -> bool:
    """Whether a deployment in `status` (no job running, engines recorded) reads `adopting` until a
    starting coordinator's adoption decides (pure)."""
    return DeploymentStatus(status) in ADOPTED_FROM


class StatusRuleError(ValueError):
    """A status written without the detail it needs (or with one it must not have): a bug."""


@dataclass(frozen=True)
class StatusChange:
    deployment: str
    status: DeploymentStatus
    detail: StatusDetail | None
    announced: bool
    opened_incident: str | None = None  # the incident this change opened (a new one)


def set_status(
    session: Session,
    deployment: Deployment,
    status: DeploymentStatus,
    detail: StatusDetail | None = None,
    *,
    serving: int | None = None,
    now: datetime | None = None,
    announce_again: bool = False,
    hit_job_id: str | None = None,
) -> StatusChange | None:
    """Move `deployment` to `status` (with `detail`, required for `degraded` and `stopped`, refused for
    `ready`), in the caller's transaction; None when nothing changed. `serving`: how many engines serve
    its generation, for the event. `announce_again`: a degraded deployment's new reason is announced too
    (a reason the operator must act on, such as self-healing giving up). `hit_job_id`: the job a new
    incident names as the one whose generation it hit."""
    if (status in WITH_DETAIL) != (detail is not None):
        raise StatusRuleError(f"deployment {deployment.name}: {status.value} with detail {detail!r}")
    at = now or utc_now()
    before = DeploymentStatus(deployment.status)
    event = MOVES[(before, status)]
    stored = detail.model_dump(mode="json") if detail is not None else None
    if before is status and _same(deployment.status_detail, stored):
        return None
    if stored is not None and before is status is DeploymentStatus.degraded and deployment.status_detail:
        stored["since"] = deployment.status_detail.get("since") or stored["since"]  # degraded since then
    if before is status is DeploymentStatus.ready and deployment.status_detail is None:
        return None
    extra: dict[str, Any] = {}
    if status is DeploymentStatus.ready and before is not DeploymentStatus.stopped:
        since = (deployment.status_detail or {}).get("since")
        if since:
            extra["degraded_for_s"] = round((at - datetime.fromisoformat(str(since))).total_seconds(), 3)
        if before is DeploymentStatus.ready:
            event = EventType.deployment_recovered  # a detail left on a ready deployment: now cleared
    deployment.status, deployment.status_detail, deployment.updated_at = status.value, stored, at
    if status is not DeploymentStatus.stopped:
        deployment.stopped_dp_size = None  # started again: the size it had is history
    session.add(deployment)
    opened: str | None = None
    if status is DeploymentStatus.stopped:
        incidents.ended_by_stop(session, deployment, at)
    elif detail is not None:
        incident, new = incidents.opened(
            session, deployment, detail.reason, detail.message, at, hit_job_id=hit_job_id
        )
        opened = incident.id if new else None
    elif before is DeploymentStatus.degraded:
        incidents.resolved(session, deployment, at)
    if event is None and announce_again:
        event = EventType.deployment_degraded
    if event is not None:
        data = {
            "deployment": deployment.name,
            "status": deployment.status,
            "generation": deployment.generation,
            "current_dp_size": deployment.current_dp_size,
            "serving": serving,
            "status_detail": deployment.status_detail,
            **extra,
        }
        enqueue_event(session, event, data, deployment_id=deployment.id, now=at)
    return StatusChange(deployment.name, status, detail, announced=event is not None, opened_incident=opened)


def _same(stored: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """The same reason and message (a new `since` alone is no change)."""
    if stored is None or new is None:
        return stored is new
    return (stored.get("reason"), stored.get("message")) == (new.get("reason"), new.get("message"))
