"""A job's error is a `JobError` from the failure that raised it to the writer, and the job row keeps it
as it always did: the members the failure gave (an explicit null too), in the model's order, nothing
added."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.backends.base import JobFailure
from app.backends.reference.endings import blame_the_silent
from app.backends.vllm.checks import FlowFailure
from app.jobs.states import JobState
from app.jobs.transitions import append_event
from tests.runner.fakes import INJECTED
from tests.runner.scenario import Scenario, make_scenario


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    """Two engines serving generation 1, one idle engine registered."""
    return make_scenario(db_engine)


def test_the_row_keeps_the_members_of_a_failure_on_one_engine(stage: Scenario) -> None:
    joiner = stage.idle[0]
    joiner.faults.add("fail_prepare")
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back and job.error is not None
    assert list(job.error) == ["phase", "engine_id", "type", "message"]
    assert (job.error["phase"], job.error["engine_id"], job.error["type"]) == (
        "preparing",
        joiner.engine_id,
        INJECTED,
    )


def test_a_failure_of_no_one_engine_keeps_its_null_engine_and_adds_no_other_member() -> None:
    error = JobFailure("preparing", "cancelled", "cancelled on request").error
    assert error.stored() == {
        "phase": "preparing",
        "engine_id": None,
        "type": "cancelled",
        "message": "cancelled on request",
    }


def test_the_silent_engine_is_blamed_on_a_copy_of_the_error() -> None:
    error = JobFailure("committing", "injected-failure", "peer closed", "e0").error
    blamed = blame_the_silent(error, {"e0": {"state": "serving"}, "e1": {"state": "unreachable"}})
    assert error.engine_id == "e0" and blamed.engine_id == "e1"
    assert list(blamed.stored()) == ["phase", "engine_id", "type", "message"]


def test_a_vllm_failure_keeps_its_http_status_and_hint_even_when_null() -> None:
    failure = FlowFailure(JobState.rolled_back, "preparing", "engine-busy", "already scaling")
    assert failure.error.stored() == {
        "phase": "preparing",
        "engine_id": None,
        "type": "engine-busy",
        "message": "already scaling",
        "http_status": None,
        "hint": None,
    }


def test_the_writer_takes_a_job_error_only(stage: Scenario) -> None:
    job = stage.run_job(3)
    with Session(stage.db) as session, pytest.raises(TypeError, match="JobError"):
        append_event(session, job_id=job.id, kind="note", changes={"error": {"type": "x", "message": "m"}})
