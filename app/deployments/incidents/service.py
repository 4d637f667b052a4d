"""Opening, amending and resolving incidents (see `app.deployments.incidents.models`), HTTP-free. Opened and
resolved by the deployment's status writer only (`app.deployments.status`), in its transaction. The job
an incident hit is named by whoever judged the deployment (it reads the jobs; the record does not)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import NotFoundError
from app.core.ids import new_id
from app.deployments.engines.models import Engine, EngineState
from app.deployments.incidents.models import INCIDENT_ID_PREFIX, Incident, IncidentPublic, IncidentState
from app.deployments.models import Deployment
from app.webhooks.models import EventType
from app.webhooks.outbox import enqueue_event


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
    (the judge's rule); a new incident names it."""
    incident = current(session, deployment.id)
    if incident is not None:
        incident.reason, incident.message, incident.updated_at = reason, message[:2000], now
        session.add(incident)
        return incident, False
    loss_at = min(filter(None, [deployment.heal_loss_at, now]))
    incident = Incident(
        id=new_id(INCIDENT_ID_PREFIX),
        deployment_id=deployment.id,
        reason=reason,
        message=message[:2000],
        generation=deployment.generation,
        loss_at=loss_at,
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


def note_lost(session: Session, deployment: Deployment, engines: Sequence[str], loss_at: datetime) -> None:
    """Engines written off or fenced: named on the open incident, whose loss time goes back to theirs."""
    incident = current(session, deployment.id)
    if incident is None:
        return
    incident.engines = list(dict.fromkeys([*incident.engines, *engines]))
    if loss_at < incident.loss_at:
        incident.loss_at = loss_at
        incident.time_to_detect_ms = _ms(incident.detected_at - loss_at)
    incident.updated_at = utc_now()
    session.add(incident)


def note_recovery_job(session: Session, deployment_id: str, job_id: str) -> None:
    incident = current(session, deployment_id)
    if incident is not None and job_id not in incident.recovery_job_ids:
        incident.recovery_job_ids = [*incident.recovery_job_ids, job_id]
        session.add(incident)


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


def record_client_outage(
    session: Session, incident_id: str, answered_at: datetime, *, none_seen: bool = False
) -> None:
    """The first canary answered: the clients' outage ends there (0 when no canary had failed before
    it: the deployment never stopped answering)."""
    incident = session.get(Incident, incident_id)
    if incident is not None and incident.client_outage_ms is None:
        outage = timedelta(0) if none_seen else max(answered_at - incident.loss_at, timedelta(0))
        incident.client_outage_ms = _ms(outage)
        incident.updated_at = utc_now()
        session.add(incident)
        session.commit()


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
