"""Observing: the views of every reference deployment from the record, in one read (a few queries for any
number of deployments and engines), and the I/O observations added to them (the probes' answers, a
starting coordinator's questions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.backends.reference.liveness.view import (
    HEARD_STATES,
    Asked,
    DeploymentView,
    EngineSeen,
    Hearing,
    JobSeen,
    Probed,
)
from app.core.shedding import heard_at
from app.core.stuck import Stuck
from app.deployments.engines.models import Engine, EngineState, refuses_key
from app.deployments.models import Deployment, EngineBackend, effective_on_engine_loss
from app.jobs.models import ReconfigurationJob
from app.jobs.states import ACTIVE_STATES

NEWEST_JOBS = 3  # enough for the self-heal attempts in a row (`Rules.max_attempts`)


def engine_seen(row: Engine, shed_at: datetime | None = None) -> EngineSeen:
    return EngineSeen(
        shed_at=shed_at,
        id=row.id,
        state=row.state,
        generation=row.generation,
        dp_rank=row.dp_rank,
        world_size=row.world_size,
        last_heartbeat_at=row.last_heartbeat_at,
        url=row.url,
        pid=row.pid,
        launched_by=row.launched_by,
        created_at=row.created_at,
        updated_at=row.updated_at,
        broken_generation=row.broken_generation,
        unresponsive_peers=tuple(row.unresponsive_peers or ()),
        broken_reported_at=row.broken_reported_at,
        data_unreachable=tuple(row.data_unreachable or ()),
        group_steps=row.group_steps,
        link_lost_at=row.link_lost_at,
        # Issue 32's condition `engine-refuses-agent-key`: never counted as serving, nor as a survivor.
        refuses_agent_key=refuses_key(row),
    )


def job_seen(row: ReconfigurationJob) -> JobSeen:
    participants = tuple(str(r.get("engine_id")) for r in row.engine_results or () if r.get("engine_id"))
    return JobSeen(
        id=row.id,
        state=row.state,
        requested_by=row.requested_by,
        created_at=row.created_at,
        updated_at=row.updated_at,
        from_dp_size=row.from_dp_size,
        to_dp_size=row.to_dp_size,
        to_generation=row.to_generation,
        phase=row.state,
        participants=participants,
        clients_out_at_end=(row.probe or {}).get("open_outage_since") is not None,
    )


def hearing(
    session: Session,
    *,
    watching_since: datetime,
    deaf_at: datetime | None,
    newest_shed: datetime | None = None,
) -> Hearing:
    """What this coordinator hears; a heartbeat it shed while saturated (`newest_shed`) is hearing too."""
    newest = session.exec(
        select(sa.func.max(Engine.last_heartbeat_at)).where(col(Engine.state).in_(list(HEARD_STATES)))
    ).one()
    if newest is not None and newest.tzinfo is None:  # SQLite hands back naive UTC
        newest = newest.replace(tzinfo=watching_since.tzinfo)
    newest = heard_at(newest, newest_shed)
    return Hearing(newest_heartbeat_at=newest, watching_since=watching_since, deaf_at=deaf_at)


def views(
    session: Session,
    heard: Hearing,
    broken_since: Mapping[str, datetime] | None = None,
    *,
    only_without_a_job: bool = False,
    shed: Mapping[str, datetime] | None = None,
    only: str | None = None,
) -> list[DeploymentView]:
    """Every reference deployment's view (deployments of size 0 too: their engines' silence counts), or
    with `only` the one of that id; `shed`: engine id -> its last heartbeat this coordinator shed
    (`app.core.shedding`)."""
    broken_since, shed = broken_since or {}, shed or {}
    chosen = select(Deployment).where(col(Deployment.backend) == EngineBackend.reference.value)
    if only is not None:
        chosen = chosen.where(col(Deployment.id) == only)
    deployments = session.exec(chosen.order_by(col(Deployment.created_at), col(Deployment.id))).all()
    ids = [d.id for d in deployments]
    if not ids:
        return []
    engines: dict[str, list[EngineSeen]] = {}
    # Columns, not objects (issue 37: every engine of the fleet, every second): `engine_seen` reads the
    # same attributes off a row.
    table = Engine.__table__  # type: ignore[attr-defined]
    for row in session.execute(
        sa.select(*table.c)
        .where(table.c.deployment_id.in_(ids), table.c.state != EngineState.left.value)
        .order_by(table.c.created_at, table.c.id)
    ).all():
        engines.setdefault(row.deployment_id, []).append(engine_seen(row, shed.get(row.id)))  # type: ignore[arg-type]
    active = {
        job.deployment_id: job_seen(job)
        for job in session.exec(
            select(ReconfigurationJob).where(
                col(ReconfigurationJob.deployment_id).in_(ids),
                col(ReconfigurationJob.state).in_([s.value for s in ACTIVE_STATES]),
            )
        ).all()
    }
    newest_jobs = newest(session, ids)
    found = []
    for deployment in deployments:
        job = active.get(deployment.id)
        if only_without_a_job and job is not None:
            continue
        newest_of = newest_jobs.get(deployment.id, [])
        found.append(
            DeploymentView(
                id=deployment.id,
                name=deployment.name,
                launcher=deployment.launcher,
                policy=effective_on_engine_loss(deployment.on_engine_loss, deployment.launcher),
                current_dp_size=deployment.current_dp_size,
                generation=deployment.generation,
                status=deployment.status,
                status_detail=deployment.status_detail,
                hearing=heard,
                engines=tuple(engines.get(deployment.id, ())),
                active_job=job,
                newest_jobs=tuple(job_seen(j) for j in newest_of),
                heal_lost=deployment.heal_lost,
                heal_loss_at=deployment.heal_loss_at,
                heal_target_dp_size=deployment.heal_target_dp_size,
                spares=deployment.spares,
                broken_since=broken_since.get(deployment.id),
                updated_at=deployment.updated_at,
            )
        )
    return found


def newest(session: Session, ids: Sequence[str]) -> dict[str, list[ReconfigurationJob]]:
    """Each deployment's `NEWEST_JOBS` newest jobs, newest first, in one query for all (issue 37: one per
    deployment was 128 queries a pass at 2,048 engines)."""
    jobs = ReconfigurationJob.__table__  # type: ignore[attr-defined]
    ranked = (
        sa.select(
            jobs.c.id,
            sa.func.row_number()
            .over(
                partition_by=jobs.c.deployment_id,
                order_by=(jobs.c.created_at.desc(), jobs.c.id.desc()),
            )
            .label("rank"),
        )
        .where(jobs.c.deployment_id.in_(list(ids)))
        .subquery()
    )
    rows = session.exec(
        select(ReconfigurationJob)
        .join(ranked, col(ReconfigurationJob.id) == ranked.c.id)
        .where(ranked.c.rank <= NEWEST_JOBS)
        .order_by(col(ReconfigurationJob.created_at).desc(), col(ReconfigurationJob.id).desc())
    ).all()
    found: dict[str, list[ReconfigurationJob]] = {}
    for row in rows:
        found.setdefault(row.deployment_id, []).append(row)
    return found


def with_probes(view: DeploymentView, gone: Mapping[str, bool]) -> DeploymentView:
    """The view with what the probes found (engine id -> its process is gone)."""
    if not gone:
        return view
    engines = tuple(replace(e, process_gone=gone[e.id]) if e.id in gone else e for e in view.engines)
    return replace(view, engines=engines)


def with_stuck(
    view: DeploymentView, stuck: Mapping[str, Stuck], probed: Mapping[str, Probed]
) -> DeploymentView:
    """The view with the heartbeats' stuck reports (`app.core.stuck`) and the freeze suspects' probes."""
    if not stuck and not probed:
        return view
    engines = tuple(
        replace(e, stuck=stuck.get(e.id), probed=probed.get(e.id))
        if e.id in stuck or e.id in probed or e.stuck or e.probed
        else e
        for e in view.engines
    )
    return replace(view, engines=engines)


def with_answers(view: DeploymentView, asked: Mapping[str, Asked]) -> DeploymentView:
    """The view with what a starting coordinator's members answered (`adoption`)."""
    engines = tuple(replace(e, asked=asked[e.id]) if e.id in asked else e for e in view.engines)
    return replace(view, engines=engines, at_start=True)


def members(view: DeploymentView) -> Sequence[EngineSeen]:
    """The engines recorded on the deployment's generation with a rank."""
    return [e for e in view.engines if e.generation == view.generation and e.dp_rank is not None]
