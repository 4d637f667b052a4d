"""The jobs' side of an incident's client outage: the evidence the jobs hold (a job's probe that saw
clients go out), and one decided figure written to the incident and to every job that shares it (the
job the incident hit when it ended with clients out, and the recovery jobs), so job and incident agree.
Above the record floor: it reads both the incidents and the jobs."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.deployments.incidents import outage
from app.deployments.incidents.models import Incident
from app.jobs.models import ReconfigurationJob
from app.jobs.transitions import append_event


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
