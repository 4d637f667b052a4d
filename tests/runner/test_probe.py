"""The canary probe on a reference-engine job, against fake agents that no canary can reach: the
probe names them on the job and the job goes on as if it were not there."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.backends.reference.flow import Flow
from app.engines.models import Engine
from app.jobs.states import JobState
from app.probe.settings import ProbeSettings
from tests.runner.scenario import Scenario, make_scenario
from tests.support.processes import free_port


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    """Two engines serving generation 1 at addresses where nothing listens, one idle engine."""
    scenario = make_scenario(db_engine)
    with Session(db_engine) as session:
        for agent in scenario.serving:
            row = session.get(Engine, agent.engine_id)
            assert row is not None
            row.url = f"http://127.0.0.1:{free_port()}"
            session.add(row)
        session.commit()
    return scenario


def with_probe(stage: Scenario, settings: ProbeSettings) -> Scenario:
    launchers = {"local": stage.launcher}
    stage.flow = Flow(stage.record, stage.settings, launchers, "test", probe_settings=settings)
    return stage


def test_a_probe_that_cannot_reach_an_engine_names_it_and_the_job_succeeds(stage: Scenario) -> None:
    with_probe(stage, ProbeSettings(interval_s=0.01, baseline_s=0.05))
    job = stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    assert job.probe is not None and job.client_downtime_ms is not None
    serving = sorted(agent.engine_id for agent in stage.serving)
    assert sorted(job.probe["unreachable"]) == serving
    assert job.probe["canaries_sent"] > 0 and job.probe["canaries_failed"] == job.probe["canaries_sent"]
    assert {"before", "prepare", "sync", "pause", "switch"} <= set(job.probe["phases"])
    notes = [e for e in stage.events(job.id) if e.kind == "probe"]
    assert len(notes) == 1 and "could not reach" in (notes[0].message or "")


def test_a_failing_job_still_carries_the_probe(stage: Scenario) -> None:
    with_probe(stage, ProbeSettings(interval_s=0.01, baseline_s=0.0))
    stage.idle[0].faults.add("fail_prepare")
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    assert job.probe is not None and "prepare" in job.probe["phases"]


def test_the_probe_switched_off_leaves_no_figures(stage: Scenario) -> None:
    with_probe(stage, ProbeSettings(enabled=False))
    job = stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    assert job.probe is None and job.client_downtime_ms is None
