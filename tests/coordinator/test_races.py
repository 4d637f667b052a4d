"""Two requests racing for one deployment: the database lets exactly one job become active."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import ActiveJobConflictError, create_reconfiguration
from app.jobs.states import JobState
from tests.support.factories import make_deployment, make_job

# Concurrent writers and the one-active-job index: the database decides.
pytestmark = pytest.mark.databases("sqlite", "postgres")


def _create_in_thread(
    db_engine: Engine, barrier: threading.Barrier, target: int
) -> str | ActiveJobConflictError:
    with Session(db_engine, expire_on_commit=False) as session:
        request = ReconfigurationCreate(deployment="demo", target_dp_size=target)
        barrier.wait()
        try:
            return create_reconfiguration(session, request=request, requested_by=RequestSource.api).job.id
        except ActiveJobConflictError as conflict:
            return conflict


def test_two_concurrent_creates_one_wins_one_gets_409_naming_it(db_engine: Engine, session: Session) -> None:
    make_deployment(session, "demo")
    barrier = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda t: _create_in_thread(db_engine, barrier, t), [2, 3]))
    winners = [r for r in results if isinstance(r, str)]
    losers = [r for r in results if isinstance(r, ActiveJobConflictError)]
    assert len(winners) == 1 and len(losers) == 1
    assert losers[0].extra["active_job_id"] == winners[0] and winners[0] in losers[0].detail


def test_two_concurrent_http_requests_one_202_one_409(client: TestClient) -> None:
    client.post("/v1/deployments", json={"name": "demo"})
    barrier = threading.Barrier(2)

    def post(target: int) -> tuple[int, dict[str, object]]:
        barrier.wait()
        response = client.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": target})
        return response.status_code, response.json()

    with ThreadPoolExecutor(2) as pool:
        results = sorted(pool.map(post, [2, 3]), key=lambda r: r[0])
    (ok_status, job), (conflict_status, problem) = results
    assert (ok_status, conflict_status) == (202, 409)
    assert problem["active_job_id"] == job["id"]


def test_the_database_itself_refuses_a_second_active_job(session: Session) -> None:
    """Even a writer that skips the service (another coordinator, a bug) cannot add one."""
    deployment = make_deployment(session, "demo")
    first = make_job(session, deployment, 2)
    columns = ReconfigurationJob.__table__.columns  # type: ignore[attr-defined]
    row = {column.name: getattr(first, column.name) for column in columns}
    row.update(id="rcfg_clone", state=JobState.preparing.value)
    with pytest.raises(IntegrityError):
        session.execute(sa.insert(ReconfigurationJob).values(**row))
        session.commit()
    session.rollback()
    assert [job.id for job in session.exec(select(ReconfigurationJob))] == [first.id]
