"""Every client-visible outage has a record (`app.deployments.incidents`): opened when a deployment stops
being whole, resolved when it serves again, linked both ways to a job whose generation it hit right
after that job ended, with its events; listed by the API. Fake agents, a real database
(tests/runner/scenario.py)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.core.clock import utc_now
from app.deployments.engines.models import Engine, EngineState
from app.deployments.engines.service import record_heartbeat
from app.deployments.incidents import outage
from app.deployments.incidents import service as incident_service
from app.deployments.incidents.models import Incident
from app.deployments.models import Deployment, DeploymentStatus, StatusDetail
from app.deployments.status import set_status
from app.jobs import incident_outage
from app.jobs.models import ReconfigurationJob, RequestSource
from app.jobs.states import JobState
from app.webhooks.models import OutboxEvent
from engine_agent.protocol import AgentHeartbeat, AgentState
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
    assert stage.job(heal_id).incident_id == incident.id  # the self-heal job names the loss it heals
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


# --- issue 34: the loss and the clients' outage on the best evidence; one loss, one incident -----------


def decide(stage: Scenario, incident_id: str, *, answered_at: datetime) -> None:
    """What the incident probe does at its first answer (`app.backends.reference.liveness.canaries`)."""
    with Session(stage.db, expire_on_commit=False) as session:
        incident = session.get(Incident, incident_id)
        assert incident is not None
        evidence = incident_outage.outage_evidence(
            session, incident, answered_at=answered_at, canaries_failed=False
        )
        found = outage.client_outage(evidence)
        assert found is not None
        incident_outage.record_client_outage(session, incident_id, found)


def test_a_job_rolled_back_with_its_clients_out_is_hit_and_it_its_incident_and_the_heal_carry_one_outage(
    stage: Scenario,
) -> None:
    """The job's canaries saw clients lose service and it ended (rolled back) before they were served
    again: the incident links it, and its outage counts from the job's canaries' last good answer, even
    though the incident's own canaries were answered from their first (it used to be recorded 0)."""
    stage.idle[0].faults.add("fail_prepare")
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    out_since = utc_now() - timedelta(seconds=3)
    with Session(stage.db) as session:  # what its canaries saw (the probe's own rule: test_outage_rules)
        row = session.get(ReconfigurationJob, job.id)
        assert row is not None
        row.probe = {**(row.probe or {}), "open_outage_since": out_since.timestamp()}
        session.add(row)
        session.commit()
    (heal_id,) = lose(stage, stage.serving[1].engine_id)
    (incident,) = incidents(stage)
    assert incident.hit_job_id == job.id and stage.job(job.id).incident_id == incident.id
    decide(stage, incident.id, answered_at=out_since + timedelta(seconds=2.5))  # answered while it heals
    asyncio.run(stage.run(heal_id))
    (incident,) = incidents(stage)
    assert (incident.client_outage_ms, incident.outage_evidence) == (2500.0, "job-probe")
    assert stage.job(job.id).client_outage_ms == 2500.0  # the rolled-back job says clients lost service
    # The heal ended after that: it records the incident's figure, not its own canaries' part of it.
    assert stage.job(heal_id).client_outage_ms == 2500.0
    assert any(e.kind == "outage" and incident.id in (e.message or "") for e in stage.events(job.id))


def test_the_survivors_record_of_their_groups_last_step_is_the_loss_over_any_heartbeat(
    stage: Scenario,
) -> None:
    """A loss while no coordinator ran: the lost engine's last stored heartbeat is old news (12.9 s
    recorded vs 7.5 s seen); the survivors say when their group last stepped, and that is kept when the
    lost engine is written off later."""
    lost, survivor = stage.serving[1].engine_id, stage.serving[0].engine_id
    lose(stage, lost)  # its last heartbeat 20 s ago: written off, on the heartbeat's evidence
    last_step = utc_now() - timedelta(seconds=7.5)
    with Session(stage.db) as session:
        beat = AgentHeartbeat(
            state=AgentState.idle,
            generation=0,
            broken_generation=1,
            broken_last_step_at=last_step.timestamp(),
        )
        record_heartbeat(session, engine_id=survivor, heartbeat=beat)
    (incident,) = incidents(stage)
    assert incident.loss_evidence == "agents"
    assert abs((incident.loss_at - last_step).total_seconds()) < 0.001
    stage.liveness_pass()  # the next pass keeps the better evidence
    (incident,) = incidents(stage)
    assert lost in incident.engines and incident.loss_evidence == "agents"
    assert abs((incident.loss_at - last_step).total_seconds()) < 0.001


def degrade(stage: Scenario) -> None:
    """The deployment degrades again, written as the liveness controller writes it (`act._status`): a
    relapse is reopened first, given when the newest job self-healing did not start was created."""
    with Session(stage.db) as session:
        deployment = session.get(Deployment, stage.deployment_id)
        assert deployment is not None
        operator_job_at = session.exec(
            select(sa.func.max(ReconfigurationJob.created_at)).where(
                ReconfigurationJob.deployment_id == deployment.id,
                ReconfigurationJob.requested_by != RequestSource.self_heal.value,
            )
        ).one()
        now = utc_now()
        incident_service.reopen_if_same_loss(session, deployment, now, operator_job_at=operator_job_at)
        detail = StatusDetail(reason="members-missing", message="1 of 1 engines serve", since=now)
        set_status(session, deployment, DeploymentStatus.degraded, detail, now=now)
        session.commit()


def test_a_relapse_while_a_loss_heals_continues_its_incident_and_an_operator_job_starts_a_new_one(
    stage: Scenario,
) -> None:
    """One loss opened `engine-stalled` and then `members-missing`: a deployment degraded again within a
    minute of its recovery, with only self-heal jobs since, is the same loss."""
    (heal_id,) = lose(stage, stage.serving[1].engine_id)
    asyncio.run(stage.run(heal_id))
    (first,) = incidents(stage)
    assert first.state == "resolved"
    degrade(stage)
    (again,) = incidents(stage)
    assert (again.id, again.state, again.serving_again_at) == (first.id, "open", None)
    assert len(events(stage, "incident.opened")) == 1

    job = stage.run_job(2)  # an operator's job makes it whole: what degrades next is a new story
    assert job.state == JobState.succeeded
    degrade(stage)
    assert sorted(i.state for i in incidents(stage)) == ["open", "resolved"]


def test_an_incident_measured_while_its_heal_records_its_probe_still_leaves_both_one_figure(
    stage: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heal reads "no measured incident", the incident's probe decides and writes its figure onto
    the heal, then the heal writes its own canaries' figure: the heal's second look after its write
    puts the incident's back (before, the heal kept 0.0 against its incident's figure)."""
    (heal_id,) = lose(stage, stage.serving[1].engine_id)
    (incident,) = incidents(stage)
    real = incident_outage.outage_for_job
    reads: list[str] = []

    def measured_right_after_the_first_read(session: Session, job_id: str) -> tuple[str, float] | None:
        reads.append(job_id)
        if len(reads) > 1:
            return real(session, job_id)
        with Session(stage.db) as other:  # the incident probe, on its own session
            found_incident = other.get(Incident, incident.id)
            assert found_incident is not None
            evidence = incident_outage.outage_evidence(
                other,
                found_incident,
                answered_at=incident.loss_at + timedelta(seconds=1.8),
                canaries_failed=True,
            )
            found = outage.client_outage(evidence)
            assert found is not None
            incident_outage.record_client_outage(other, incident.id, found)
        return None

    monkeypatch.setattr(incident_outage, "outage_for_job", measured_right_after_the_first_read)
    run = asyncio.run(stage.record.load(heal_id))
    own = {"client_outage_ms": 0.0, "client_slowest_answer_ms": 5.0}
    asyncio.run(stage.record.record_probe(run, own, "client outage 0.0 ms"))
    (incident,) = incidents(stage)
    assert incident.client_outage_ms == 1800.0 and len(reads) == 2
    assert stage.job(heal_id).client_outage_ms == incident.client_outage_ms
