"""Opening, amending and resolving incidents (see `app.deployments.incidents.models`), HTTP-free. Opened and
resolved by the deployment's status writer only (`app.deployments.status`), in its transaction; the loss
time and the clients' outage follow the evidence rules of `app.deployments.incidents.outage`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import NotFoundError
from app.core.ids import new_id
from app.deployments.engines.models import Engine, EngineState
from app.deployments.incidents import outage
from app.deployments.incidents.models import INCIDENT_ID_PREFIX, Incident, IncidentPublic, IncidentState
from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationJob, RequestSource
from app.jobs.states import TERMINAL_STATES, JobState
from app.jobs.transitions import append_event
from app.webhooks.models import EventType
from app.webhooks.outbox import enqueue_event

HIT_WINDOW_S = 60.0  # a job that ended this long before an incident is linked as the one it hit


class IncidentNotFoundError(NotFoundError):
    code = "incident-not-found"


def current(session: Session, deployment_id: str) -> Incident | None:
    """The deployment's open incident, if one."""
    return session.exec(
        select(Incident).where(
            Incident.deployment_id == deployment_id, Incident.state == IncidentState.open.value
        )
    ).first()


def opened(session: Session, deployment: Deployment, reason: str, message: str, now: datetime) -> Incident:
    """The deployment stopped being whole: its open incident, amended; the one it just resolved, opened
    again when this continues the same loss (`outage.same_loss`); or a new one (with its event)."""
    incident = current(session, deployment.id) or _continued(session, deployment, now)
    if incident is not None:
        incident.reason, incident.message, incident.updated_at = reason, message[:2000], now
        session.add(incident)
        return incident
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
    hit = _job_just_ended(session, deployment, now)
    if hit is not None:
        incident.hit_job_id = hit.id
        hit.incident_id = incident.id
        session.add(hit)
    session.add(incident)
    _announce(session, deployment, incident, EventType.incident_opened, now)
    return incident


def _continued(session: Session, deployment: Deployment, now: datetime) -> Incident | None:
    """The incident resolved just before, opened again when the deployment degrading now continues its
    loss (a relapse while its recovery goes on: one loss, one incident)."""
    last = session.exec(
        select(Incident)
        .where(Incident.deployment_id == deployment.id, Incident.state == IncidentState.resolved.value)
        .order_by(col(Incident.updated_at).desc())
        .limit(1)
    ).first()
    if last is None or last.serving_again_at is None:
        return None
    operator_job = session.exec(
        select(ReconfigurationJob.id).where(
            ReconfigurationJob.deployment_id == deployment.id,
            col(ReconfigurationJob.created_at) >= last.detected_at,
            ReconfigurationJob.requested_by != RequestSource.self_heal.value,
        )
    ).first()
    resolved_s_ago = (now - last.serving_again_at).total_seconds()
    if not outage.same_loss(
        resolved_s_ago=resolved_s_ago, operator_job_since=operator_job is not None, window_s=HIT_WINDOW_S
    ):
        return None
    last.state = IncidentState.open.value
    last.serving_again_at, last.time_to_serving_ms = None, None
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


def outage_evidence(
    session: Session,
    incident: Incident,
    *,
    answered_at: datetime | None,
    canaries_failed: bool,
) -> outage.OutageEvidence:
    """What the record knows of an incident's outage, with what its canaries saw."""
    since = None
    if incident.hit_job_id is not None:
        hit = session.get(ReconfigurationJob, incident.hit_job_id)
        opened_at = (hit.probe or {}).get("open_outage_since") if hit is not None else None
        if isinstance(opened_at, int | float):
            since = datetime.fromtimestamp(opened_at, UTC)
    known = incident.loss_evidence or outage.LossEvidence.detected.value
    return outage.OutageEvidence(
        loss_at=incident.loss_at,
        loss_evidence=outage.LossEvidence(known),
        job_probe_since=since,
        canaries_failed=canaries_failed,
        answered_at=answered_at,
        serving_again_at=incident.serving_again_at,
    )


def record_client_outage(session: Session, incident_id: str, found: outage.ClientOutage) -> None:
    """The clients' outage of an incident, decided (`outage.client_outage`): on the incident, and on the
    jobs that share it (`jobs_sharing`), each with a line on its log; commits."""
    incident = session.get(Incident, incident_id)
    if incident is None or incident.outage_evidence is not None:
        return
    incident.client_outage_ms = found.ms
    incident.outage_started_at = found.started_at
    incident.outage_evidence = found.source.value
    incident.updated_at = utc_now()
    session.add(incident)
    session.commit()
    if found.ms is None:
        return
    for job_id in jobs_sharing(session, incident):
        append_event(
            session,
            job_id=job_id,
            kind="outage",
            message=f"client outage {found.ms:.1f} ms until the deployment served again "
            f"(incident {incident.id}, from {found.source.value})",
            changes={"client_outage_ms": found.ms},
        )


def jobs_sharing(session: Session, incident: Incident) -> list[str]:
    """The jobs that carry an incident's client outage: the one it hit when that job ended with its
    clients out (a rollback in the middle of the outage), and its recovery jobs."""
    ids = list(incident.recovery_job_ids)
    if incident.hit_job_id is not None:
        hit = session.get(ReconfigurationJob, incident.hit_job_id)
        if hit is not None and (hit.probe or {}).get("open_outage_since") is not None:
            ids.insert(0, hit.id)
    return list(dict.fromkeys(ids))


def outage_for_job(session: Session, job_id: str) -> tuple[str, float] | None:
    """(incident id, client outage ms) when `job_id` shares a measured incident's outage: a job ending
    after its incident was measured records that figure, not its own canaries' part of it."""
    job = session.get(ReconfigurationJob, job_id)
    if job is None:
        return None
    candidates = session.exec(
        select(Incident).where(
            Incident.deployment_id == job.deployment_id, col(Incident.client_outage_ms).is_not(None)
        )
    ).all()
    for incident in candidates:
        if job_id in jobs_sharing(session, incident) and incident.client_outage_ms is not None:
            return incident.id, incident.client_outage_ms
    return None


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


def _job_just_ended(session: Session, deployment: Deployment, now: datetime) -> ReconfigurationJob | None:
    """The deployment's newest job, when the incident hit it (`outage.hits`): it made the generation the
    incident hits and ended within the last `HIT_WINDOW_S`, or it ended while its clients had no answer
    (their outage goes on into the incident)."""
    newest = session.exec(
        select(ReconfigurationJob)
        .where(ReconfigurationJob.deployment_id == deployment.id)
        .order_by(col(ReconfigurationJob.created_at).desc())
        .limit(1)
    ).first()
    if newest is None or JobState(newest.state) not in TERMINAL_STATES:
        return None
    hit = outage.hits(
        ended_s_ago=(now - newest.updated_at).total_seconds(),
        succeeded=newest.state == JobState.succeeded.value,
        made_this_generation=newest.to_generation == deployment.generation,
        clients_out_at_end=(newest.probe or {}).get("open_outage_since") is not None,
        window_s=HIT_WINDOW_S,
    )
    return newest if hit else None


def _announce(
    session: Session, deployment: Deployment, incident: Incident, event: EventType, now: datetime
) -> None:
    shown = IncidentPublic.model_validate(incident).model_copy(update={"deployment": deployment.name})
    enqueue_event(session, event, shown.model_dump(mode="json"), deployment_id=deployment.id, now=now)


def _ms(delta: timedelta) -> float:
    return round(max(delta.total_seconds(), 0.0) * 1000.0, 1)
