"""Acting: one verdict written through the one writers, in one transaction, only if the record is still
what the judge saw.

Each engine the verdict changes is written with a compare-and-set on what was observed (its state and its
last heartbeat): a heartbeat that arrived since (or another coordinator's pass) wins, and the whole
verdict is dropped; the next pass judges again. The deployment's status goes through
`app.deployments.status.set_status` (its event and incident in the same transaction), each lost engine
is announced (`engine.unreachable`), the engines named on the open incident. Then, in its own
transaction, the one job the verdict asks for (`app.jobs.service.create_reconfiguration`; a refusal is
logged, the next pass asks again); the engines written off are handed back for their launchers to stop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session, col

from app.backends.reference.liveness.verdict import Fate, HealJob, Verdict
from app.backends.reference.liveness.view import DeploymentView
from app.core.errors import DomainError
from app.deployments.engines.models import Engine, EnginePublic
from app.deployments.incidents import service as incidents
from app.deployments.models import Deployment, DeploymentStatus, StatusDetail
from app.deployments.status import adopting_from, set_status
from app.jobs.active import active_job_id
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import create_reconfiguration, link_incident
from app.launchers.base import EngineHandle
from app.webhooks.models import EventType
from app.webhooks.outbox import enqueue_event

log = logging.getLogger(__name__)

REQUESTER = "coordinator"


@dataclass
class Acted:
    """What one verdict did: written (or dropped as stale), the job created, the engines to stop."""

    deployment: str
    applied: bool
    job_id: str | None = None
    released: dict[str, list[EngineHandle]] = field(default_factory=dict)


class _Stale(Exception):
    """The record moved since it was observed."""


def act(session: Session, view: DeploymentView, verdict: Verdict, now: datetime) -> Acted:
    """Write `verdict` (see the module doc); commits."""
    acted = Acted(verdict.deployment, applied=False)
    try:
        _write(session, view, verdict, now, acted)
    except _Stale as stale:
        session.rollback()
        log.info("deployment %s: %s; judged again at the next pass", view.name, stale)
        return acted
    acted.applied = True
    for note in verdict.notes:
        log.warning("deployment %s: %s", view.name, note)
    if verdict.job is not None:
        acted.job_id = _request(session, view, verdict.job)
    return acted


def write_adopting(session: Session, views: list[DeploymentView], now: datetime) -> list[str]:
    """A starting coordinator's adoption begins: each of these deployments that says it serves reads
    `adopting` until the adoption decides (issue 34: past the start's bound it read `ready` with a member
    frozen), if the record is still what was seen; commits. The ids of those now `adopting`."""
    marked: list[str] = []
    for view in views:
        deployment = session.get(Deployment, view.id)
        seen = (view.generation, view.current_dp_size, view.status)
        if (
            deployment is None
            or (deployment.generation, deployment.current_dp_size, deployment.status) != seen
        ):
            continue
        if view.current_dp_size > 0 and adopting_from(view.status):
            set_status(session, deployment, DeploymentStatus.adopting, now=now)
            marked.append(view.id)
    session.commit()
    return marked


def write_adopted(session: Session, deployment_ids: list[str], now: datetime) -> None:
    """The adoption's verdict for the deployments whose every member answered serving: `ready` again
    (those still `adopting`; another writer that moved one since wins); commits."""
    for deployment_id in deployment_ids:
        deployment = session.get(Deployment, deployment_id)
        if deployment is not None and deployment.status == DeploymentStatus.adopting.value:
            set_status(
                session, deployment, DeploymentStatus.ready, serving=deployment.current_dp_size, now=now
            )
    session.commit()


def write_reported_break(session: Session, view: DeploymentView, verdict: Verdict, now: datetime) -> None:
    """`judge.judge_reported_break`'s verdict (a status, nothing else), in the caller's transaction: the
    heartbeat's, which holds the deployment's row (`reported.group_broke`) and commits both together."""
    assert not verdict.engines and verdict.memory is None and not verdict.lost_to_incident, verdict
    deployment = session.get(Deployment, view.id)
    if verdict.status is not None and deployment is not None:
        _status(session, deployment, verdict, now)


def _write(session: Session, view: DeploymentView, verdict: Verdict, now: datetime, acted: Acted) -> None:
    deployment = session.get(Deployment, view.id)
    if deployment is None:
        raise _Stale("deleted")
    seen = (view.generation, view.current_dp_size, view.status)
    if (deployment.generation, deployment.current_dp_size, deployment.status) != seen:
        raise _Stale("its generation, size or status changed")
    active = active_job_id(session, deployment_id=view.id)
    if active != (view.active_job.id if view.active_job else None):
        raise _Stale("a job started or ended")
    for change in verdict.engines:
        before = view.engine(change.engine_id)
        values: dict[str, object] = {
            "state": change.state,
            "dp_rank": change.dp_rank,
            "generation": change.generation,
            "world_size": change.world_size,
            "link_lost_at": change.link_lost_at,
            "updated_at": now,
        }
        if change.heard_at is not None:
            values["last_heartbeat_at"] = change.heard_at
        written = session.execute(
            sa.update(Engine)
            .where(
                col(Engine.id) == change.engine_id,
                col(Engine.state) == before.state,
                col(Engine.last_heartbeat_at).is_not_distinct_from(before.last_heartbeat_at),
            )
            .values(**values)
        )
        if written.rowcount != 1:  # type: ignore[attr-defined]
            if change.fate is Fate.answered:
                continue  # a heartbeat since its answer says as much
            raise _Stale(f"{change.engine_id} was heard from (or changed) since")
        if change.release:
            handle = EngineHandle(engine_id=change.engine_id, url=before.url, pid=before.pid)
            acted.released.setdefault(before.launched_by or view.launcher, []).append(handle)
    if verdict.memory is not None:
        memory = verdict.memory
        deployment.heal_lost, deployment.heal_loss_at = memory.lost, memory.loss_at
        deployment.heal_target_dp_size = memory.target
        session.add(deployment)
    if verdict.status is not None:
        _status(session, deployment, verdict, now)
    for engine_ids, loss_at in verdict.lost_to_incident:
        incidents.note_lost(session, deployment, list(engine_ids), loss_at)
    _announce_lost(session, view, deployment, verdict, now)
    session.commit()


def _status(session: Session, deployment: Deployment, verdict: Verdict, now: datetime) -> None:
    status = verdict.status
    assert status is not None
    detail = (
        None
        if status.reason is None
        else StatusDetail(reason=status.reason, message=status.message, hint=status.hint, since=now)
    )
    if detail is not None:  # a relapse that continues a loss reopens its incident (one loss, one incident)
        incidents.reopen_if_same_loss(session, deployment, now, operator_job_at=status.operator_job_at)
    change = set_status(
        session,
        deployment,
        DeploymentStatus(status.status),
        detail,
        serving=status.serving,
        now=now,
        announce_again=status.announce_again,
        hit_job_id=status.hit_job_id,
    )
    if change is not None and change.opened_incident and status.hit_job_id:
        link_incident(session, job_id=status.hit_job_id, incident_id=change.opened_incident)


def _announce_lost(
    session: Session, view: DeploymentView, deployment: Deployment, verdict: Verdict, now: datetime
) -> None:
    for change in verdict.engines:
        if not change.announce_unreachable:
            continue
        row = session.get(Engine, change.engine_id)
        if row is None:
            continue
        session.refresh(row)
        public = EnginePublic.of(row, deployment=deployment.name)
        # The event says what the silence made it (`unreachable`, on its rank), even when the same pass
        # wrote it off.
        data = {
            **public.model_dump(mode="json"),
            "state": "unreachable",
            "dp_rank": view.engine(change.engine_id).dp_rank,
            "member": change.member,
            "deployment_status": deployment.status,
        }
        enqueue_event(session, EventType.engine_unreachable, data, deployment_id=deployment.id, now=now)
        log.warning("engine %s of %s: %s; marked unreachable", row.id, deployment.name, change.why)


def _request(session: Session, view: DeploymentView, heal: HealJob) -> str | None:
    """Create the job; it records the loss it recovers from and, for the first job after it
    (`detected`), the time to detect; the open incident names it, and it names the incident."""

    def note(session: Session, job: ReconfigurationJob) -> None:
        if heal.loss_at is not None:
            job.loss_at = heal.loss_at
            if heal.detected:
                detect = max(0.0, (job.created_at - heal.loss_at).total_seconds() * 1000.0)
                job.time_to_detect_ms = round(detect, 1)
        incident_id = incidents.note_recovery_job(session, view.id, job.id)
        if incident_id is not None:
            job.incident_id = incident_id
        session.add(job)

    try:
        outcome = create_reconfiguration(
            session,
            request=ReconfigurationCreate(
                deployment=view.name, target_dp_size=heal.target, reason=heal.reason
            ),
            requested_by=RequestSource.self_heal,
            requester=REQUESTER,
            on_created=note,
        )
    except DomainError as exc:  # out of limits, a cleanup failure to resolve, an operator's job first
        session.rollback()
        log.warning("deployment %s: no self-heal job to %s: %s", view.name, heal.target, exc)
        return None
    log.warning("deployment %s: self-heal job %s (%s)", view.name, outcome.job.id, heal.reason)
    return outcome.job.id
