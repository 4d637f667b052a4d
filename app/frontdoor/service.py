"""The feed's writer and readers (no HTTP). `refresh` derives a deployment's rank set from the record
(`rules`) and, when it differs from the last version, writes the next `resourceVersion`; every
coordinator may call it (the version is a primary key: of two racing writers one wins, the other reads
its row). The front door's record says where it is and which version its keeper applied."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import InvalidRequestError
from app.deployments.engines.models import Engine
from app.deployments.front_door import FrontDoor, FrontDoorPublic
from app.deployments.models import Deployment
from app.deployments.service import get_deployment
from app.frontdoor.models import EndpointPublic, EndpointSetPublic, EndpointSetVersion
from app.frontdoor.rules import Endpoint, EngineFacts, JobFacts, as_switched, rank_set, roles_of, switch_of
from app.frontdoor.wakeup import FEED_CHANGED
from app.jobs.models import ReconfigurationJob
from app.jobs.states import ACTIVE_STATES

KEEP_VERSIONS = 500  # per deployment: a watcher further behind than this gets the oldest kept version


def _job_facts(job: ReconfigurationJob) -> JobFacts:
    switched_to, new_ranks = switch_of(job.engine_results)
    return JobFacts(job.id, job.state, roles_of(job.engine_results), switched_to, new_ranks)


def _active_jobs(session: Session, deployment_ids: list[str] | None = None) -> dict[str, JobFacts]:
    """The active job of each deployment (of these, or of all), by deployment id."""
    statement = select(ReconfigurationJob).where(
        col(ReconfigurationJob.state).in_([s.value for s in ACTIVE_STATES])
    )
    if deployment_ids is not None:
        statement = statement.where(col(ReconfigurationJob.deployment_id).in_(deployment_ids))
    found: dict[str, JobFacts] = {}
    for job in session.exec(statement).all():
        found.setdefault(job.deployment_id, _job_facts(job))
    return found


def _engine_facts(session: Session, deployment_ids: list[str] | None = None) -> dict[str, list[EngineFacts]]:
    """The engines of each deployment (of these, or of all) as the rules read them: their columns, no
    objects."""
    engines = Engine.__table__  # type: ignore[attr-defined]
    statement = sa.select(
        engines.c.deployment_id,
        engines.c.id,
        engines.c.url,
        engines.c.state,
        engines.c.dp_rank,
        engines.c.generation,
    )
    if deployment_ids is not None:
        statement = statement.where(engines.c.deployment_id.in_(deployment_ids))
    found: dict[str, list[EngineFacts]] = {}
    for deployment_id, *facts in session.execute(statement).all():
        found.setdefault(deployment_id, []).append(EngineFacts(*facts))
    return found


def _derived(
    deployment: Deployment, engines: list[EngineFacts], job: JobFacts | None
) -> tuple[list[Endpoint], str | None, int]:
    generation, _ = as_switched(deployment.generation, engines, job)
    formed = deployment.current_dp_size > 0  # a stopped deployment's engines are retired, not lost
    return rank_set(deployment.generation, engines, job, formed), job.id if job else None, generation


def derive(session: Session, deployment: Deployment) -> tuple[list[Endpoint], str | None, int]:
    """The rank set the record implies now, the active job's id, and the generation it serves (the
    new one from the moment a job's results say every member switched)."""
    engines = _engine_facts(session, [deployment.id]).get(deployment.id, [])
    return _derived(deployment, engines, _active_jobs(session, [deployment.id]).get(deployment.id))


def derive_switched(
    session: Session, deployment_id: str, job_id: str, state: str, engine_results: list[dict[str, Any]]
) -> list[EndpointPublic] | None:
    """The rank set the record will imply once job `job_id`, still in `state`, has `engine_results`
    (a job that saw every member commit, before it writes so): reads only, so the front door can be
    given the set before the write, which may wait for SQLite's write lock (`keeper.serve_ahead`).
    None where that job is not the deployment's active one in that state (moved on elsewhere)."""
    deployment = session.get(Deployment, deployment_id)
    job = _active_jobs(session, [deployment_id]).get(deployment_id)
    if deployment is None or job is None or job.id != job_id or job.state != state:
        return None
    engines = _engine_facts(session, [deployment_id]).get(deployment_id, [])
    switched_to, new_ranks = switch_of(engine_results)
    job = JobFacts(job.id, job.state, roles_of(engine_results), switched_to, new_ranks)
    endpoints, _, _ = _derived(deployment, engines, job)
    return [EndpointPublic.model_validate(e) for e in _stored(endpoints)]


def _stored(endpoints: list[Endpoint]) -> list[dict[str, Any]]:
    return [
        {
            "engine_id": e.engine_id,
            "address": e.address,
            "dp_rank": e.dp_rank,
            "generation": e.generation,
            "state": e.state.value,
            "reason": e.reason,
        }
        for e in endpoints
    ]


def latest(session: Session, deployment_id: str) -> EndpointSetVersion | None:
    return session.exec(
        select(EndpointSetVersion)
        .where(EndpointSetVersion.deployment_id == deployment_id)
        .order_by(col(EndpointSetVersion.resource_version).desc())
        .limit(1)
    ).first()


def refresh(session: Session, deployment: Deployment) -> tuple[EndpointSetVersion, bool]:
    """The deployment's current version, written first when the record implies another rank set
    (second: whether this call wrote it)."""
    return _refresh(session, deployment, derive(session, deployment), latest(session, deployment.id))


def _refresh(
    session: Session,
    deployment: Deployment,
    derived: tuple[list[Endpoint], str | None, int],
    last: EndpointSetVersion | None,
) -> tuple[EndpointSetVersion, bool]:
    endpoints, job_id, generation = derived
    stored = _stored(endpoints)
    if last is not None and last.endpoints == stored and last.generation == generation:
        return last, False
    version = EndpointSetVersion(
        deployment_id=deployment.id,
        resource_version=(last.resource_version if last else 0) + 1,
        generation=generation,
        job_id=job_id,
        endpoints=stored,
        changed_at=utc_now(),
    )
    session.add(version)
    try:
        session.commit()
    except IntegrityError:  # another coordinator wrote this version first: read what it wrote
        session.rollback()
        again = latest(session, deployment.id)
        assert again is not None
        return again, False
    session.refresh(version)
    FEED_CHANGED.ring()
    if version.resource_version % 50 == 0:
        _prune(session, deployment.id, version.resource_version)
    return version, True


def _prune(session: Session, deployment_id: str, newest: int) -> None:
    old = session.exec(
        select(EndpointSetVersion).where(
            EndpointSetVersion.deployment_id == deployment_id,
            col(EndpointSetVersion.resource_version) <= newest - KEEP_VERSIONS,
        )
    ).all()
    for row in old:
        session.delete(row)
    session.commit()


FeedMemo = dict[str, tuple[int, tuple[Any, ...]]]  # deployment id -> (its newest version, what derived it)


def refresh_all(session: Session, memo: FeedMemo | None = None) -> list[tuple[str, EndpointSetVersion]]:
    """Every deployment's feed brought up to date; the versions written by this call. Four queries for
    any number of deployments and engines (it runs every `PUBLISH_EVERY_S`; issue 37: 2,048 engines).
    `memo` (the publisher's, kept across passes): a deployment whose newest version is the one a pass
    derived or checked from the same facts (its generation, whether it has one, its engines' columns,
    its active job) is
    not derived again, nor its stored rank set read: a steady fleet's pass reads columns and compares."""
    # Each deployment's id and generation as columns: a steady pass loads no deployment object (each
    # decodes its JSON columns; 128 deployments 4 times a second), only those whose feed may move.
    table = Deployment.__table__  # type: ignore[attr-defined]
    heads = session.execute(sa.select(table.c.id, table.c.generation, table.c.current_dp_size)).all()
    if not heads:
        return []
    engines, jobs = _engine_facts(session), _active_jobs(session)
    versions = EndpointSetVersion.__table__  # type: ignore[attr-defined]
    numbers = dict(
        session.execute(
            sa.select(versions.c.deployment_id, sa.func.max(versions.c.resource_version)).group_by(
                versions.c.deployment_id
            )
        ).all()
    )
    moving: dict[str, tuple[Any, ...]] = {}
    for deployment_id, generation, size in heads:
        facts = (generation, size > 0, engines.get(deployment_id, []), jobs.get(deployment_id))
        seen = memo.get(deployment_id) if memo is not None else None
        if seen is not None and seen[0] == numbers.get(deployment_id) and seen[1] == facts:
            continue
        moving[deployment_id] = facts
    if not moving:
        return []
    loaded = {d.id: d for d in session.exec(select(Deployment).where(col(Deployment.id).in_(list(moving))))}
    pending = [(loaded[i], facts) for i, facts in moving.items() if i in loaded]
    # The newest versions' columns, not objects: most passes change nothing and write nothing.
    ids = [d.id for d, _ in pending]
    newest = (
        sa.select(versions.c.deployment_id, sa.func.max(versions.c.resource_version).label("newest"))
        .where(versions.c.deployment_id.in_(ids))
        .group_by(versions.c.deployment_id)
        .subquery()
    )
    columns = (
        versions.c.deployment_id,
        versions.c.resource_version,
        versions.c.generation,
        versions.c.endpoints,
    )
    joined = sa.and_(
        versions.c.deployment_id == newest.c.deployment_id, versions.c.resource_version == newest.c.newest
    )
    lasts = {
        row.deployment_id: row for row in session.execute(sa.select(*columns).join(newest, joined)).all()
    }
    written = []
    for deployment, facts in pending:
        derived = _derived(deployment, facts[2], facts[3])
        last = lasts.get(deployment.id)
        if last is not None and last.endpoints == _stored(derived[0]) and last.generation == derived[2]:
            if memo is not None:
                memo[deployment.id] = (last.resource_version, facts)
            continue
        version, changed = _refresh(session, deployment, derived, latest(session, deployment.id))
        if memo is not None and changed:  # (another coordinator's version: compared again next pass)
            memo[deployment.id] = (version.resource_version, facts)
        if changed:
            written.append((deployment.id, version))
    return written


def after(session: Session, deployment_id: str, resource_version: int) -> EndpointSetVersion | None:
    """The first version after `resource_version` (the oldest kept, for a watcher left far behind)."""
    return session.exec(
        select(EndpointSetVersion)
        .where(
            EndpointSetVersion.deployment_id == deployment_id,
            col(EndpointSetVersion.resource_version) > resource_version,
        )
        .order_by(col(EndpointSetVersion.resource_version))
        .limit(1)
    ).first()


def front_door_of(session: Session, deployment_id: str) -> FrontDoor | None:
    return session.get(FrontDoor, deployment_id)


def front_door_public(row: FrontDoor | None) -> FrontDoorPublic | None:
    return FrontDoorPublic.of(row) if row is not None else None


def public(session: Session, deployment: Deployment, version: EndpointSetVersion) -> EndpointSetPublic:
    return EndpointSetPublic(
        deployment=deployment.name,
        generation=version.generation,
        resource_version=version.resource_version,
        job_id=version.job_id,
        changed_at=version.changed_at,
        endpoints=[EndpointPublic.model_validate(e) for e in version.endpoints],
        front_door=front_door_public(front_door_of(session, deployment.id)),
    )


def current_public(session: Session, *, ref: str) -> EndpointSetPublic:
    """`GET .../endpoints`: the deployment's rank set as of now (written first if it changed)."""
    deployment = get_deployment(session, ref=ref)
    version, _ = refresh(session, deployment)
    return public(session, deployment, version)


def next_public(
    session: Session, *, ref: str, resource_version: int, derive_first: bool = True
) -> EndpointSetPublic | None:
    """The first version after `resource_version`, or None while there is none. `derive_first` off:
    reads only, where the coordinator's publisher writes the versions (however many watch)."""
    deployment = get_deployment(session, ref=ref)
    if derive_first:
        refresh(session, deployment)
    newest = latest(session, deployment.id)
    if resource_version > (newest.resource_version if newest is not None else 0):
        # Versions only grow and are rows (a restart keeps them): one ahead of the newest was never ours,
        # and waiting for it would hold the caller for nothing (Kubernetes: "too large resource version").
        raise InvalidRequestError(
            f"resourceVersion {resource_version} is ahead of the newest one of {deployment.name} "
            f"({newest.resource_version if newest is not None else 0}): watch from the version you last read",
            code="resource-version-ahead",
        )
    version = after(session, deployment.id, resource_version)
    return public(session, deployment, version) if version is not None else None


def set_front_door(session: Session, *, ref: str, url: str, keeper: str) -> str:
    """Record (or update) the deployment's front door; its id."""
    deployment = get_deployment(session, ref=ref)
    row = session.get(FrontDoor, deployment.id) or FrontDoor(
        deployment_id=deployment.id, url=url, keeper=keeper
    )
    row.url, row.keeper, row.updated_at = url, keeper, utc_now()
    session.add(row)
    session.commit()
    return deployment.id


def record_applied(
    session: Session, deployment_id: str, resource_version: int, counters: dict[str, Any] | None = None
) -> datetime | None:
    """The keeper applied this version (never moves backwards)."""
    row = session.get(FrontDoor, deployment_id)
    if row is None:
        return None
    if row.applied_version is None or resource_version > row.applied_version:
        row.applied_version = resource_version
        row.applied_at = utc_now()
        if counters is not None:
            row.counters = counters
        session.add(row)
        session.commit()
    return row.applied_at
