"""Crash recovery against FAKE agents: a coordinator dies at each point of a job (the runner's own test
hook stops it there, then its task is cancelled as a crash would end it), and a successor reconciles
the job from what the agents report. No job stays active and no engine stays paused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.core.runner_settings import HANG_POINTS
from app.jobs.models import ReconfigurationJob
from app.jobs.states import JobState
from app.jobs.transitions import transition
from engine_agent.protocol import Strategy
from tests.runner.scenario import Scenario, crashed_at, make_scenario


def reconcile(stage: Scenario, job_id: str) -> ReconfigurationJob:
    asyncio.run(stage.reconcile(job_id))
    job = stage.job(job_id)
    assert JobState(job.state).value in ("succeeded", "rolled_back", "failed"), job.state
    reachable = [agent for agent in stage.agents.values() if "unreachable" not in agent.faults]
    assert not any(agent.paused for agent in reachable), "an engine was left paused"
    return job


@pytest.mark.parametrize(
    ("point", "outcome"),
    [
        ("prepared", "rolled_back"),
        ("synced", "rolled_back"),
        ("paused", "rolled_back"),
        ("switched", "succeeded"),
        ("cleaning_up", "succeeded"),
    ],
)
def test_a_job_stranded_at_each_point_ends_as_the_agents_allow(
    db_engine: DbEngine, tmp_path: Path, point: str, outcome: str
) -> None:
    assert point in HANG_POINTS
    stage, job_id = crashed_at(db_engine, tmp_path, point)
    job = reconcile(stage, job_id)
    assert job.state == outcome, job.error
    deployment = stage.deployment()
    if outcome == "succeeded":
        assert (deployment.current_dp_size, deployment.generation) == (3, 2)
        assert all(agent.generation == 2 for agent in stage.agents.values())
    else:
        assert job.error is not None and job.error["type"] == "coordinator-restarted"
        assert (deployment.current_dp_size, deployment.generation) == (2, 1)
        assert all(agent.generation == 1 for agent in stage.serving)
        assert all(agent.ops(job_id)[-1] == "abort" for agent in stage.agents.values())
        assert stage.launcher.released == [stage.idle[0].engine_id]
    if point == "paused":
        assert job.downtime_ms is not None and job.downtime_ms > 0
    elif outcome == "rolled_back":
        assert job.downtime_ms == 0.0


def test_blocking_stranded_inside_its_pause_resumes_all(db_engine: DbEngine, tmp_path: Path) -> None:
    stage, job_id = crashed_at(db_engine, tmp_path, "paused", strategy=Strategy.blocking)
    assert stage.job(job_id).state == JobState.preparing  # blocking pauses while still preparing
    job = reconcile(stage, job_id)
    assert job.state == JobState.rolled_back
    assert all(agent.generation == 1 for agent in stage.serving)


def test_mixed_some_switched_the_others_paused_completes_the_commit(
    db_engine: DbEngine, tmp_path: Path
) -> None:
    stage, job_id = crashed_at(db_engine, tmp_path, "paused")
    first = stage.serving[0]
    asyncio.run(first.switch(job_id))  # the switch reached one engine before the crash
    job = reconcile(stage, job_id)
    assert job.state == JobState.succeeded, job.error
    assert all(agent.generation == 2 for agent in stage.agents.values())
    assert [agent.ops(job_id)[-1] for agent in stage.agents.values()] == ["switch", "switch", "switch"]
    assert stage.deployment().generation == 2


@pytest.mark.parametrize("fault", ["fail_switch", "unreachable"])
def test_mixed_where_the_rest_cannot_switch_fails_and_degrades(
    db_engine: DbEngine, tmp_path: Path, fault: str
) -> None:
    stage, job_id = crashed_at(db_engine, tmp_path, "paused")
    switched, broken, joiner = stage.serving[0], stage.serving[1], stage.idle[0]
    asyncio.run(switched.switch(job_id))
    broken.faults.add(fault)
    job = reconcile(stage, job_id)
    assert job.state == JobState.failed
    assert stage.deployment().status == "degraded"
    assert job.error is not None
    assert job.error["type"] == ("partial-switch" if fault == "unreachable" else "injected-failure")
    generations = {r["engine_id"]: r["agent"]["generation"] for r in job.engine_results}
    assert generations[switched.engine_id] == 2
    assert generations[broken.engine_id] == (None if fault == "unreachable" else 1)
    if fault == "unreachable":
        # The joiner was still paused for the job: it was sent back (abort), not left waiting.
        assert joiner.ops(job_id)[-1] == "abort"


def test_a_job_that_never_planned_rolls_back_without_calling_agents(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine)
    job_id = stage.new_job(3)
    with Session(db_engine) as session:
        transition(session, job_id=job_id, from_state=JobState.pending, to_state=JobState.preparing)
    job = reconcile(stage, job_id)
    assert job.state == JobState.rolled_back
    assert job.error is not None and job.error["type"] == "coordinator-restarted"
    assert all(agent.ops() == [] for agent in stage.agents.values())
