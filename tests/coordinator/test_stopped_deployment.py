"""A deployment whose engines were stopped on purpose (`app.jobs.stop`, issue 34): its record says
`stopped` with the size it had, no job of it stays open, and `epctl up` brings that size back."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.cli.up import DEMO_ENGINES, start_size
from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment, DeploymentStatus
from app.deployments.status import MOVES, set_status
from app.jobs.models import ReconfigurationJob
from app.jobs.states import ACTIVE_STATES, TERMINAL_STATES, JobState, is_allowed
from app.jobs.stop import END_ON_STOP, record_stopped, size_to_bring_back
from app.jobs.transitions import transition
from tests.support.factories import make_deployment, make_job, register_engines


def test_every_open_job_state_has_an_allowed_end_when_the_engines_stop() -> None:
    assert set(END_ON_STOP) == set(ACTIVE_STATES)
    for state, ended in END_ON_STOP.items():
        assert ended in TERMINAL_STATES and is_allowed(state, ended), (state, ended)


def test_a_stopped_deployment_can_only_be_started_again() -> None:
    stopped = DeploymentStatus.stopped
    assert {after for before, after in MOVES if before is stopped} == {
        DeploymentStatus.ready,
        DeploymentStatus.degraded,
        stopped,
    }
    assert {before for before, after in MOVES if after is stopped} == set(DeploymentStatus)


@pytest.mark.parametrize(
    ("current", "heal_target", "stopped_before", "size"),
    [
        (3, None, None, 3),
        (2, 3, None, 3),  # a self-heal growing it back to 3 was running: 3
        (0, None, 3, 3),  # stopped again while stopped: what the first stop kept
        (0, None, None, None),  # never ran
    ],
)
def test_the_size_kept_is_the_one_the_deployment_was_meant_to_have(
    current: int, heal_target: int | None, stopped_before: int | None, size: int | None
) -> None:
    assert size_to_bring_back(current, heal_target, stopped_before) == size


@pytest.mark.parametrize(
    ("requested", "had", "size", "says"),
    [
        (None, None, DEMO_ENGINES, None),
        (None, 3, 3, "back at 3 engines"),
        (3, 3, 3, "back at 3 engines"),
        (2, 3, 2, "at 2 engines (--engines), not the 3 it had"),
    ],
)
def test_epctl_up_starts_a_stopped_deployment_at_the_size_it_had_or_says_why_not(
    requested: int | None, had: int | None, size: int, says: str | None
) -> None:
    got, line = start_size(requested, had)
    assert got == size
    assert (line is None) if says is None else (line is not None and says in line), line


def test_a_stop_during_a_heal_ends_its_job_and_keeps_the_size_to_bring_back(db_engine: DbEngine) -> None:
    with Session(db_engine, expire_on_commit=False) as session:
        deployment = make_deployment(session, "demo")
        register_engines(session, deployment, 2)
        deployment.current_dp_size, deployment.generation = 2, 4
        deployment.heal_target_dp_size = 3  # `replace`: lost one of 3, growing back
        session.add(deployment)
        session.commit()
        job = make_job(session, deployment, 3)
        transition(session, job_id=job.id, from_state=JobState.pending, to_state=JobState.preparing)
        stopped = record_stopped(session, deployment, by="epctl up stopped")
        assert stopped is not None and stopped.size == 3
        assert stopped.jobs_ended == {job.id: "cancelled"}
        assert record_stopped(session, deployment, by="epctl up stopped") is None  # nothing more to say

    with Session(db_engine) as session:
        row = session.get(Deployment, deployment.id)
        assert row is not None
        assert (row.status, row.current_dp_size, row.stopped_dp_size) == ("stopped", 0, 3)
        assert row.status_detail is not None and row.status_detail["reason"] == "stopped"
        assert "at size 3" in row.status_detail["message"]
        assert row.heal_target_dp_size is None
        ended = session.get(ReconfigurationJob, job.id)
        assert ended is not None and ended.state == "cancelled"
        engines = session.exec(select(Engine).where(Engine.deployment_id == deployment.id)).all()
        assert {e.state for e in engines} == {EngineState.left.value}

        set_status(session, row, DeploymentStatus.ready, serving=3)  # a job started it again
        assert (row.status, row.status_detail, row.stopped_dp_size) == ("ready", None, None)
