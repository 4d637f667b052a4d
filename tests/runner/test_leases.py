"""Two coordinators on one database never run the same job: claims are leases taken by one UPDATE."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core.clock import utc_now
from app.jobs.cleanup import CleanupFailedError, check_no_unresolved_cleanup
from app.jobs.models import CleanupState, ReconfigurationJob
from app.runner.leases import Leases
from tests.support.factories import make_deployment, make_job

# Leases and claims between coordinators: the database decides.
pytestmark = pytest.mark.databases("sqlite", "postgres")


def coordinator(name: str) -> Leases:
    """The lease queries of one coordinator named `name`."""
    return Leases(name, lease_s=30.0)


def claim(db: Engine, leases: Leases) -> str | None:
    with Session(db, expire_on_commit=False) as session:
        return leases.claim_pending(session)


def test_a_pending_job_is_claimed_by_exactly_one_coordinator(db_engine: Engine, session: Session) -> None:
    job = make_job(session, make_deployment(session), 2)
    first, second = coordinator("coordinator-a"), coordinator("coordinator-b")
    assert claim(db_engine, first) == job.id
    assert claim(db_engine, second) is None
    row = session.get(ReconfigurationJob, job.id, populate_existing=True)
    assert row is not None and row.lease_owner == "coordinator-a"


def test_an_expired_lease_can_be_taken_over(db_engine: Engine, session: Session) -> None:
    job = make_job(session, make_deployment(session), 2)
    first, second = coordinator("coordinator-a"), coordinator("coordinator-b")
    assert claim(db_engine, first) == job.id
    row = session.get(ReconfigurationJob, job.id, populate_existing=True)
    assert row is not None
    row.lease_expires_at = utc_now() - timedelta(seconds=1)
    session.add(row)
    session.commit()
    assert claim(db_engine, second) == job.id


def test_a_job_started_by_a_dead_coordinator_is_reconciled_once_its_lease_expires(
    db_engine: Engine, session: Session
) -> None:
    job = make_job(session, make_deployment(session), 2)
    row = session.get(ReconfigurationJob, job.id)
    assert row is not None
    row.state, row.lease_owner = "preparing", "dead-coordinator"
    row.lease_expires_at = utc_now() + timedelta(seconds=30)
    session.add(row)
    session.commit()
    survivor = coordinator("coordinator-b")
    with Session(db_engine) as s:
        assert survivor.claim_stranded(s) == []
    row.lease_expires_at = utc_now() - timedelta(seconds=1)
    session.add(row)
    session.commit()
    with Session(db_engine) as s:
        assert survivor.claim_stranded(s) == [job.id]
    with Session(db_engine) as s:
        assert coordinator("coordinator-c").claim_stranded(s) == []


def test_lease_renewal_fails_once_another_coordinator_holds_the_job(
    db_engine: Engine, session: Session
) -> None:
    job = make_job(session, make_deployment(session), 2)
    first, second = coordinator("coordinator-a"), coordinator("coordinator-b")
    assert claim(db_engine, first) == job.id
    with Session(db_engine) as s:
        assert first.extend(s, job.id)
        assert not second.extend(s, job.id)


def test_an_unresolved_cleanup_failure_names_its_job_and_engine(db_engine: Engine, session: Session) -> None:
    deployment = make_deployment(session)
    job = make_job(session, deployment, 2)
    row = session.get(ReconfigurationJob, job.id)
    assert row is not None
    row.state = "succeeded"
    row.cleanup_state = CleanupState.failed.value
    row.cleanup = {"failed_engine_id": "demo-1", "error": "boom", "retired_generation": 1}
    session.add(row)
    session.commit()
    try:
        check_no_unresolved_cleanup(session, deployment.id, deployment.name)
    except CleanupFailedError as exc:
        assert job.id in exc.detail and "demo-1" in exc.detail
        assert exc.extra["engine_id"] == "demo-1"
    else:
        raise AssertionError("an unresolved cleanup failure must refuse the next job")


def test_one_claim_takes_every_pending_job_up_to_its_bound_oldest_first(
    db_engine: Engine, session: Session
) -> None:
    """Issue 37: 128 deployments forming at once were claimed one per runner turn (a turn also runs the
    periodic passes), so the last job began minutes after the first."""
    jobs = [make_job(session, make_deployment(session, name=f"claim-{k}"), 2).id for k in range(5)]
    first, second = coordinator("coordinator-a"), coordinator("coordinator-b")
    with Session(db_engine, expire_on_commit=False) as s:
        assert first.claim_pending_jobs(s, 3) == jobs[:3]
    with Session(db_engine, expire_on_commit=False) as s:
        assert second.claim_pending_jobs(s, 10) == jobs[3:]
    first.set_running(jobs[:3])
    with Session(db_engine, expire_on_commit=False) as s:
        assert first.claim_pending_jobs(s, 10) == []
