"""Partial growth (issue 38): a grow that gets only some of its engines commits the largest size it
reaches and keeps the rest as a standing target, completed by a later job when capacity appears; an
operator may ask for all or nothing. The rules as tables, then the runner's real flow on fake agents
(tests/runner/scenario.py) with a launcher of limited capacity; real engines: tests/e2e."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.backends.reference.launching import reachable_size
from app.deployments.models import Deployment
from app.jobs.states import JobState
from app.runner.scheduled import reconcile_desired_sizes
from app.scale import standing
from app.scale.standing import JobSeen, Standing, due, standing_target
from tests.runner.scenario import Scenario, make_scenario

T0 = datetime(2026, 12, 7, 2, 0, 0)


@pytest.mark.parametrize(
    ("members", "idle", "target", "reach"),
    [
        (2, 2, 4, 4),  # enough: the target
        (2, 5, 4, 4),  # more than enough: still the target
        (2, 1, 4, 3),  # short: as far as the idle engines reach
        (2, 0, 4, None),  # nothing to add: the job fails, nothing committed
        (0, 1, 3, 1),  # a first start short of engines serves on what it got
    ],
)
def test_a_partial_grow_reaches_as_far_as_the_engines_go(
    members: int, idle: int, target: int, reach: int | None
) -> None:
    assert reachable_size(members, idle, target) == reach


def seen(state: str, to: int, reached: int | None, by: str = "api", job_id: str = "j") -> JobSeen:
    return JobSeen(job_id, by, state, to, reached)


OK, FAILED = JobState.succeeded.value, JobState.failed.value


@pytest.mark.parametrize(
    ("jobs", "current", "expected"),
    [
        ([seen(OK, 4, 3, job_id="p")], 3, Standing(4, "p", 3)),
        ([seen(OK, 4, 4)], 4, None),  # reached it all
        ([seen(OK, 4, 3)], 4, None),  # reached since (a completion job)
        # Completion attempts and self-heals keep the size: the partial job behind them still decides.
        ([seen(FAILED, 4, None, "standing-target"), seen(OK, 4, 3, job_id="p")], 3, Standing(4, "p", 3)),
        ([seen(OK, 3, 3, "self-heal"), seen(OK, 5, 3, job_id="p")], 3, Standing(5, "p", 3)),
        # An operator's (or an autoscaler's) later job sets another size: nothing stands.
        ([seen(OK, 2, 2), seen(OK, 4, 3)], 2, None),
        ([seen(FAILED, 5, None), seen(OK, 4, 3)], 3, None),
        ([seen(JobState.preparing.value, 4, None), seen(OK, 4, 3)], 3, None),
        ([], 2, None),
    ],
)
def test_what_stands(jobs: list[JobSeen], current: int, expected: Standing | None) -> None:
    assert standing_target(jobs, current) == expected


@pytest.mark.parametrize(
    ("static", "idle", "ended_s_ago", "is_due"),
    [
        (True, 1, 0.0, True),  # a static pool shows its capacity: at once
        (True, 0, 3600.0, False),  # ... and nothing to try without it
        (False, 0, 29.0, False),  # a launcher tells only by trying: after retry_s
        (False, 0, 30.0, True),
    ],
)
def test_when_a_completion_is_tried(static: bool, idle: int, ended_s_ago: float, is_due: bool) -> None:
    now = T0 + timedelta(seconds=ended_s_ago)
    jobs = [JobSeen("j", "api", OK, 4, 3, finished_at=T0)]
    assert due(jobs, static=static, idle_engines=idle, now=now, retry_s=30.0) is is_due


def standing_of(stage: Scenario) -> Standing | None:
    with Session(stage.db) as session:
        deployment = session.get(Deployment, stage.deployment_id)
        assert deployment is not None
        return standing.of(session, deployment)


def test_a_grow_short_of_engines_commits_what_it_reached_and_a_later_job_completes_it(
    db_engine: DbEngine, client: TestClient
) -> None:
    stage = make_scenario(db_engine, serving=2, idle=0)
    stage.launcher.capacity = 1
    strict = stage.run_job(4, all_or_nothing=True)
    assert strict.state == JobState.rolled_back.value and strict.error is not None, strict
    assert strict.error["type"] == "launch-failed" and stage.deployment().current_dp_size == 2

    job = stage.run_job(4)
    assert job.state == JobState.succeeded.value, job.error
    assert (job.to_dp_size, job.reached_dp_size) == (4, 3) and stage.deployment().current_dp_size == 3
    assert standing_of(stage) == Standing(4, job.id, 3)
    desired = client.get("/v1/deployments/demo").json()["desired"]
    assert (desired["dp_size"], desired["standing_target"], desired["source"]) == (4, 4, "standing-target")

    stage.launcher.capacity = 0  # not due yet, then due but no capacity: the standing target stays
    assert asyncio.run(reconcile_desired_sizes(stage.record, standing_retry_s=3600.0)) == []
    [attempt] = asyncio.run(reconcile_desired_sizes(stage.record, standing_retry_s=1e-6))
    assert stage.run_job_id(attempt).state in (JobState.failed.value, JobState.rolled_back.value)
    assert standing_of(stage) == Standing(4, job.id, 3)

    stage.launcher.capacity = 1  # capacity appears
    [completion] = asyncio.run(reconcile_desired_sizes(stage.record, standing_retry_s=1e-6))
    done = stage.run_job_id(completion)
    assert done.requested_by == "standing-target" and done.state == JobState.succeeded.value
    assert (done.to_dp_size, done.reached_dp_size) == (4, 4) and stage.deployment().current_dp_size == 4
    assert standing_of(stage) is None
    assert client.get("/v1/deployments/demo").json()["desired"]["standing_target"] is None
