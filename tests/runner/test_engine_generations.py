"""Each engine's own generation before and after a job, on its per-engine results (what `epctl jobs
show` and the dashboard print): a leaver leaves, a joiner of a rolled-back job never served, a switch
that failed part-way shows what each engine says it serves."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine as DbEngine

from app.jobs.states import JobState
from tests.runner.scenario import Scenario, make_scenario


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    """Two engines serving generation 1, one idle engine registered."""
    return make_scenario(db_engine)


def generations(job_results: list[dict[str, object]]) -> dict[object, tuple[object, object]]:
    return {r["engine_id"]: (r["generation_before"], r["generation_after"]) for r in job_results}


def test_a_scale_down_shows_the_stayer_on_the_new_generation_and_the_leaver_on_none(stage: Scenario) -> None:
    job = stage.run_job(1)
    assert job.state == JobState.succeeded, job.error
    stayer, leaver = stage.serving
    assert generations(job.engine_results) == {stayer.engine_id: (1, 2), leaver.engine_id: (1, None)}


def test_a_rolled_back_scale_up_shows_the_old_generation_kept_and_a_joiner_that_never_served(
    stage: Scenario,
) -> None:
    joiner = stage.idle[0]
    joiner.faults.add("fail_prepare")
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    assert generations(job.engine_results) == {
        stage.serving[0].engine_id: (1, 1),
        stage.serving[1].engine_id: (1, 1),
        joiner.engine_id: (None, None),
    }


def test_a_switch_failing_part_way_shows_what_each_engine_serves(stage: Scenario) -> None:
    failing = stage.serving[1]
    failing.faults.add("fail_switch")
    job = stage.run_job(3)
    assert job.state == JobState.failed
    assert generations(job.engine_results) == {
        stage.serving[0].engine_id: (1, 2),
        failing.engine_id: (1, 1),
        stage.idle[0].engine_id: (None, 2),
    }
