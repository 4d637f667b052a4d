"""Every client-visible outage has a record (`app.deployments.incidents`): opened when a deployment stops
being whole, resolved when it serves again, linked both ways to a job whose generation it hit right
after that job ended, with its events; listed by the API. Fake agents, a real database
(tests/runner/scenario.py)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.core.clock import utc_now
from app.deployments.engines.models import Engine, EngineState
from app.deployments.incidents.models import Incident
from app.jobs.states import JobState
from app.webhooks.models import OutboxEvent
from tests.runner.scenario import Scenario, make_scenario


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    return make_scenario(db_engine, serving=2, idle=1)


def lose(stage: Scenario, engine_id: str) -> list[str]:
    """`engine_id` went silent (unreachable past its timeout); the others left the broken group; one
    liveness pass (its self-heal jobs)."""
    with Session(stage.db) as session:
        for row in session.exec(select(Engine).where(Engine.deployment_id == stage.deployment_id)).all():
            if row.id == engine_id:
                row.state, row.last_heartbeat_at = (
                    EngineState.unreachable.value,
                    utc_now() - timedelta(seconds=20),
                )
            elif row.state == EngineState.serving.value:
                row.state, row.dp_rank, row.generation = EngineState.idle.value, None, 0
                stage.agents[row.id].rank, stage.agents[row.id].generation = None, 0
            session.add(row)
        session.commit()
    return stage.liveness_pass().jobs


def incidents(stage: Scenario) -> list[Incident]:
    with Session(stage.db, expire_on_commit=False) as session:
        return list(session.exec(select(Incident)).all())


def events(stage: Scenario, kind: str) -> list[OutboxEvent]:
    with Session(stage.db) as session:
        return list(session.exec(select(OutboxEvent).where(OutboxEvent.type == kind)).all())


def test_a_loss_right_after_a_job_opens_an_incident_linked_to_that_job_and_healing_resolves_it(
    stage: Scenario,
) -> None:
    job = stage.run_job(3)
    assert job.state == JobState.succeeded
    lost = stage.agents[next(a for a in stage.agents if stage.agents[a].rank == 2)].engine_id
    (heal_id,) = lose(stage, lost)
    (incident,) = incidents(stage)
    assert (incident.state, incident.hit_job_id, incident.generation) == ("open", job.id, job.to_generation)
    assert incident.engines == [lost] and incident.reason == "engine-unreachable"
    assert stage.job(job.id).incident_id == incident.id  # the job links back
    assert len(events(stage, "incident.opened")) == 1
    assert incident.recovery_job_ids == [heal_id]
    asyncio.run(stage.run(heal_id))
    (incident,) = incidents(stage)
    assert incident.state == "resolved" and incident.recovery_job_ids[0] == heal_id
    assert incident.serving_again_at is not None and incident.time_to_serving_ms is not None
    assert incident.time_to_serving_ms >= 20_000  # counted from the lost engine's last heartbeat
    (resolved,) = events(stage, "incident.resolved")
    assert resolved.payload["data"]["id"] == incident.id


def test_a_loss_long_after_the_last_job_links_no_job(stage: Scenario) -> None:
    lose(stage, stage.serving[1].engine_id)
    (incident,) = incidents(stage)
    assert incident.hit_job_id is None


def test_the_api_lists_and_shows_incidents(stage: Scenario, client: TestClient) -> None:
    lose(stage, stage.serving[1].engine_id)
    (incident,) = incidents(stage)
    listed = client.get("/v1/incidents", params={"deployment": "demo", "state": "open"})
    assert listed.status_code == 200, listed.text
    assert [i["id"] for i in listed.json()["data"]] == [incident.id]
    shown = client.get(f"/v1/incidents/{incident.id}").json()
    assert shown["deployment"] == "demo" and shown["engines"] == [stage.serving[1].engine_id]
    assert client.get("/v1/incidents/inc_nope").status_code == 404
