"""Opening, amending and resolving incidents (see `app.deployments.incidents.models`), HTTP-free. Opened and
resolved by the deployment's status writer only (`app.deployments.status`), in its transaction; the loss
time follows the evidence rules of `app.deployments.incidents.outage`. The job an incident hit is named by
whoever judged the deployment, and the outage it shares with jobs is written by `app.jobs.incident_outage`
(they read the jobs; the record does not)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import NotFoundError
from app.core.ids import new_id
from app.deployments.engines.models import Engine, EngineState
from app.deployments.incidents import outage
from app.deployments.incidents.models import INCIDENT_ID_PREFIX, Incident, IncidentPublic, IncidentState
from app.deployments.models import Deployment
from app.webhooks.models import EventType
from app.webhooks.outbox import enqueue_event

SAME_LOSS_WINDOW_S = 60.0  # a relapse this soon after an incident resolved continues it (`outage.same_loss`)


class IncidentNotFoundError(NotFoundError):
    code = "incident-not-found"


def current(session: Session, deployment_id: str) -> Incident | None:
    """The deployment's open incident, if one."""
    return session.exec(
        select(Incident).where(
            Incident.deployment_id == deployment_id, Incident.state == IncidentState.open.value
        )
    ).first()


def opened(
    session: Session,
    deployment: Deployment,
    reason: str,
    message: str,
    now: datetime,
    *,
    hit_job_id: str | None = None,
) -> tuple[Incident, bool]:
    """The deployment stopped being whole: its open incident, amended, or a new one (with its event),
    and whether it is new. `hit_job_id`: the job that made the generation it hits, when one just ended
    (the judge's rule, `outage.hits`); a new incident names it. A relapse that continues a loss was
    reopened before (`reopen_if_same_loss`), so it is amended here."""
    incident = current(session, deployment.id)
    if incident is not None:
        incident.reason, incident.message, incident.updated_at = reason, message[:2000], now
        session.add(incident)
        return incident, False
    loss_at, evidence = outage.loss_moment(
        group_last_step_at=_group_last_step(session, deployment),
        heartbeat_at=deployment.heal_loss_at,
        detected_at=now,
    )
    incident = Incident(
        id=new_id(INCIDENT_ID_PREFIX),
        deployment_id=deployment.id,
        reason=reason,
        message=message[:2000],
        generation=deployment.generation,
        loss_at=loss_at,
        loss_evidence=evidence.value,
        detected_at=now,
        time_to_detect_ms=_ms(now - loss_at),
        created_at=now,
        updated_at=now,
    )
    lost = session.exec(
        select(Engine.id).where(
            Engine.deployment_id == deployment.id,
            col(Engine.state).in_([EngineState.fenced.value, EngineState.unreachable.value]),
        )
    ).all()
    incident.engines = sorted(lost)
    incident.hit_job_id = hit_job_id
    session.add(incident)
    _announce(session, deployment, incident, EventType.incident_opened, now)
    return incident, True


def reopen_if_same_loss(
    session: Session, deployment: Deployment, now: datetime, *, operator_job_at: datetime | None
) -> Incident | None:
    """The incident resolved just before, opened again when the deployment degrading now continues its
    loss (a relapse while its recovery goes on: one loss, one incident). `operator_job_at`: when the
    deployment's newest job that self-healing did not start was created (the caller reads the jobs): an
    operator's job since the incident makes the relapse a new loss."""
    if current(session, deployment.id) is not None:
        return None
    last = session.exec(
        select(Incident)
        .where(Incident.deployment_id == deployment.id, Incident.state == IncidentState.resolved.value)
        .order_by(col(Incident.updated_at).desc())
        .limit(1)
    ).first()
    if last is None or last.serving_again_at is None:
        return None
    resolved_s_ago = (now - last.serving_again_at).total_seconds()
    operator_job_since = operator_job_at is not None and operator_job_at >= last.detected_at
    if not outage.same_loss(
        resolved_s_ago=resolved_s_ago, operator_job_since=operator_job_since, window_s=SAME_LOSS_WINDOW_S
    ):
        return None
    last.state = IncidentState.open.value
    last.serving_again_at, last.time_to_serving_ms = None, None
    session.add(last)
    return last


def _group_last_step(session: Session, deployment: Deployment) -> datetime | None:
    """When the deployment's generation last stepped, as its members that saw it break report (the
    latest of their reports: each stepped with every other member until then)."""
    return session.exec(
        select(sa.func.max(Engine.broken_last_step_at)).where(
            Engine.deployment_id == deployment.id, Engine.broken_generation == deployment.generation
        )
    ).one()


def note_group_broke(session: Session, deployment_id: str, generation: int, last_step_at: datetime) -> None:
    """A member reports when its broken group last stepped: the open incident of that generation takes
    it as its loss time (the agents' record beats a heartbeat; later reports move it to the latest
    step, when the group last served)."""
    incident = current(session, deployment_id)
    if incident is None or incident.generation != generation:
        return
    agents = outage.LossEvidence.agents
    known = outage.LossEvidence(incident.loss_evidence) if incident.loss_evidence else None
    if known is agents and last_step_at <= incident.loss_at:
        return
    if known is not agents and known is not None and not outage.better_loss(known, agents):
        return
    incident.loss_at, incident.loss_evidence = min(last_step_at, incident.detected_at), agents.value
    incident.time_to_detect_ms = _ms(incident.detected_at - incident.loss_at)
    incident.updated_at = utc_now()
    session.add(incident)


def note_lost(session: Session, deployment: Deployment, engines: Sequence[str], loss_at: datetime) -> None:
    """Engines written off or fenced: named on the open incident, whose loss time goes back to their last
    heartbeat (unless the survivors' own record of the loss is there: it is the better evidence)."""
    incident = current(session, deployment.id)
    if incident is None:
        return
    incident.engines = list(dict.fromkeys([*incident.engines, *engines]))
    known = outage.LossEvidence(incident.loss_evidence) if incident.loss_evidence else None
    heartbeat = outage.LossEvidence.heartbeat
    if loss_at < incident.loss_at and (known is None or not outage.better_loss(heartbeat, known)):
        incident.loss_at, incident.loss_evidence = loss_at, heartbeat.value
        incident.time_to_detect_ms = _ms(incident.detected_at - loss_at)
    incident.updated_at = utc_now()
    session.add(incident)


def note_recovery_job(session: Session, deployment_id: str, job_id: str) -> str | None:
    """A self-heal job recovering from the open incident: named on it; its id (the job names it back,
    `incident_id`), or None when none is open."""
    incident = current(session, deployment_id)
    if incident is None:
        return None
    if job_id not in incident.recovery_job_ids:
        incident.recovery_job_ids = [*incident.recovery_job_ids, job_id]
        session.add(incident)
    return incident.id


def resolved(session: Session, deployment: Deployment, now: datetime) -> Incident | None:
    """The deployment is whole again: its open incident resolved (with its event)."""
    incident = current(session, deployment.id)
    if incident is None:
        return None
    incident.state = IncidentState.resolved.value
    incident.serving_again_at = now
    incident.time_to_serving_ms = _ms(now - incident.loss_at)
    incident.updated_at = now
    session.add(incident)
    _announce(session, deployment, incident, EventType.incident_resolved, now)
    return incident


def ended_by_stop(session: Session, deployment: Deployment, now: datetime) -> Incident | None:
    """The deployment's engines were stopped on purpose: its open incident ends there, without a
    recovery (`serving_again_at` stays null: it never served again)."""
    incident = current(session, deployment.id)
    if incident is None:
        return None
    incident.state = IncidentState.resolved.value
    incident.message = f"{incident.message}; ended: the deployment was stopped"[:2000]
    incident.updated_at = now
    session.add(incident)
    _announce(session, deployment, incident, EventType.incident_resolved, now)
    return incident


def public(session: Session, incident: Incident) -> IncidentPublic:
    deployment = session.get(Deployment, incident.deployment_id)
    shown = IncidentPublic.model_validate(incident)
    return shown.model_copy(update={"deployment": deployment.name if deployment else ""})


def get_incident(session: Session, *, incident_id: str) -> Incident:
    incident = session.get(Incident, incident_id)
    if incident is None:
        raise IncidentNotFoundError(f"no incident {incident_id!r}", incident_id=incident_id)
    return incident


def list_incidents(
    session: Session, *, deployment_id: str | None = None, state: IncidentState | None = None, limit: int = 50
) -> list[Incident]:
    query = select(Incident)
    if deployment_id is not None:
        query = query.where(Incident.deployment_id == deployment_id)
    if state is not None:
        query = query.where(Incident.state == state.value)
    return list(session.exec(query.order_by(col(Incident.id).desc()).limit(limit)).all())


def _announce(
    session: Session, deployment: Deployment, incident: Incident, event: EventType, now: datetime
) -> None:
    shown = IncidentPublic.model_validate(incident).model_copy(update={"deployment": deployment.name})
    enqueue_event(session, event, shown.model_dump(mode="json"), deployment_id=deployment.id, now=now)


def _ms(delta: timedelta) -> float:
    return round(max(delta.total_seconds(), 0.0) * 1000.0, 1)
