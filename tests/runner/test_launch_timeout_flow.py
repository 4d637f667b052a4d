"""A job's launch gets its deployment's launch readiness timeout (issue 34): the deployment's
`launch_timeout_s` where set, else the adaptive deadline from the launches this coordinator saw; the
job's log says which, and names a launch past its deadline that is still starting. Fake agents and a
fake launcher, a real database (the rule itself: tests/runner/test_launch_readiness.py)."""

from __future__ import annotations

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.deployments.models import Deployment
from app.jobs.states import JobState
from tests.runner.scenario import Scenario, make_scenario


def _set_launch_timeout(stage: Scenario, seconds: float | None) -> None:
    with Session(stage.db) as session:
        deployment = session.get(Deployment, stage.deployment_id)
        assert deployment is not None
        deployment.launch_timeout_s = seconds
        session.add(deployment)
        session.commit()


def _launch_notes(stage: Scenario, job_id: str) -> list[str]:
    return [e.message or "" for e in stage.events(job_id) if e.kind == "launch"]


def test_a_launch_waits_as_long_as_the_deployment_says(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine, idle=0)
    _set_launch_timeout(stage, 150.0)
    stage.launcher.launch_history.record("demo", 100.0)  # what was seen does not matter: it is set
    job = stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    [(spec, deadline_s)] = stage.launcher.asked
    assert (spec.launch_timeout_s, deadline_s) == (150.0, 150.0)
    assert _launch_notes(stage, job.id) == [
        "launching 1 engine(s): ready within 150 s (the deployment's launch_timeout_s)"
    ]


def test_without_a_setting_the_launch_deadline_adapts_to_the_launches_seen(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine, idle=0)  # the coordinator's launch deadline: 30 s
    stage.launcher.launch_history.record("other", 12.0)
    stage.launcher.launch_history.record("demo", 20.0)
    job = stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    [(spec, deadline_s)] = stage.launcher.asked
    assert (spec.launch_timeout_s, deadline_s) == (None, 60.0)  # 3x its own slowest
    [note] = _launch_notes(stage, job.id)
    assert "ready within 60 s (adaptive; slowest recent launch 20.0 s)" in note, note


def test_a_launch_past_its_deadline_and_still_starting_is_named_once_in_the_jobs_log(
    db_engine: DbEngine,
) -> None:
    stage = make_scenario(db_engine, idle=0, launch_delay_s=0.6)  # three cancel checks
    stage.launcher.late = {"demo-x": "agent demo-x still starting after 31s: its process runs"}
    job = stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    notes = _launch_notes(stage, job.id)
    assert notes[1:] == ["agent demo-x still starting after 31s: its process runs"], notes
