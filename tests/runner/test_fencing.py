"""Fenced generations, the coordinator's side: a number is granted once, in the database, before any
agent hears of it, and never handed out again (`app.backends.reference.fencing`)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import Engine as DbEngine

from app.backends.base import JobMovedOn
from app.jobs.states import JobState
from tests.runner.scenario import Scenario, make_scenario


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    """Two engines serving generation 1, one idle engine registered."""
    return make_scenario(db_engine)


def test_an_abandoned_generation_is_never_granted_again(stage: Scenario) -> None:
    stage.idle[0].faults.add("fail_prepare")
    abandoned = stage.run_job(3)
    assert abandoned.state == JobState.rolled_back and abandoned.to_generation == 2
    assert stage.deployment().generation == 1

    job = stage.run_job(1)
    assert job.state == JobState.succeeded, job.error
    assert job.to_generation == 3  # not 2: agents were told of 2 once, for a job that gave it up
    assert stage.deployment().generation == 3
    assert stage.serving[0].generation == 3


def test_a_generation_an_engine_reports_is_never_granted_again(stage: Scenario) -> None:
    """An engine that completed a switch the record never learnt of (thawed after a freeze) serves a
    number above the deployment's: the next job's generation is above that one too."""
    stage.idle[0].generation = 7
    job = stage.run_job(1)
    assert job.state == JobState.succeeded, job.error
    assert job.to_generation == 8 and stage.serving[0].generation == 8


def test_a_lease_holder_thawed_after_its_job_moved_on_writes_nothing(stage: Scenario) -> None:
    """A coordinator frozen past its lease: meanwhile another one reconciled the job to an end. The
    thawed holder's next log row is refused (`JobMovedOn`), so nothing follows the terminal transition."""
    job_id = stage.new_job(3)
    stale = asyncio.run(stage.record.load(job_id))  # what the frozen holder knew: pending
    stage.cancel(job_id)
    asyncio.run(stage.run(job_id))  # the job ends (cancelled) under another run
    ended = stage.events(job_id)
    assert stage.job(job_id).state == JobState.cancelled
    with pytest.raises(JobMovedOn):
        asyncio.run(stage.record.note(stale, "plan", "written by a holder that lost its lease"))
    assert stage.events(job_id) == ended
