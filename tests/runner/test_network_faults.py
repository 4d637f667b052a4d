"""The network between hosts is a fault we survive (issue 24), in-process: a member the coordinator
cannot hear while its group steps is a lost control link, not a lost engine (a condition, no heal,
jobs fail closed until it is heard again); a broken data link re-forms the generation on the largest
set of engines that reach one another, fencing the rest until their network is back. Fake agents and
a real database (tests/runner/scenario.py); the rules are rows of tests/runner/test_liveness_rules.py;
real hosts in tests/hosts."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.core.clock import utc_now
from app.deployments.engines.models import Engine, EngineState
from app.deployments.engines.service import record_heartbeat
from app.jobs.states import JobState
from engine_agent.protocol import AgentHeartbeat, AgentState
from tests.runner.scenario import Scenario, make_scenario


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    return make_scenario(db_engine, serving=3, idle=0)


def beat(stage: Scenario, engine_id: str, **fields: object) -> None:
    agent = stage.agents[engine_id]
    heartbeat = AgentHeartbeat(
        state=AgentState.serving if agent.rank is not None else AgentState.idle,
        generation=agent.generation,
        rank=agent.rank,
        world_size=agent.world_size,
        **fields,  # type: ignore[arg-type]
    )
    with Session(stage.db) as session:
        record_heartbeat(session, engine_id=engine_id, heartbeat=heartbeat)


def silence(stage: Scenario, engine_id: str, seconds: float = 30.0) -> None:
    with Session(stage.db) as session:
        row = session.get(Engine, engine_id)
        assert row is not None
        row.last_heartbeat_at = utc_now() - timedelta(seconds=seconds)
        session.add(row)
        session.commit()


def expire(stage: Scenario) -> None:
    """One liveness pass (heartbeat timeout 15 s)."""
    stage.liveness_pass()


def test_a_member_the_coordinator_cannot_hear_while_its_group_steps_is_a_lost_link_not_a_lost_engine(
    stage: Scenario, client: TestClient
) -> None:
    cut = stage.serving[2].engine_id
    for agent in stage.serving[:2]:
        beat(stage, agent.engine_id, group_steps=500)  # the others serve on, no break
    silence(stage, cut)
    expire(stage)
    rows = stage.engine_rows()
    assert rows[cut].state == EngineState.serving.value and rows[cut].link_lost_at is not None
    shown = client.get("/v1/deployments/demo").json()
    assert shown["status"] == "ready", shown
    assert [(c["type"], c["engine_id"]) for c in shown["conditions"]] == [
        ("engine-unreachable-from-coordinator", cut)
    ]
    assert stage.liveness_pass().jobs == []  # nothing heals
    refused = client.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2})
    assert refused.status_code == 409 and refused.json()["code"] == "membership-unknown", refused.text
    assert cut in refused.json()["detail"]
    forced = client.post(
        "/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2, "force": True}
    )
    assert forced.status_code == 202 and forced.json()["force"] is True, forced.text
    client.post(f"/v1/reconfigurations/{forced.json()['id']}/cancel")
    beat(stage, cut)  # heard again: the condition clears
    assert client.get("/v1/deployments/demo").json()["conditions"] == []


def cut_data(stage: Scenario, cut: str) -> None:
    """`cut`'s data link is down: every member left the broken group (each heartbeats over the control
    network), `cut` reaches none of the others and none of them reaches it."""
    members = [a.engine_id for a in stage.serving]
    for agent in stage.serving:
        agent.rank, agent.generation, agent.world_size = None, 0, 0
    for engine_id in members:
        unreachable = [m for m in members if m != engine_id] if engine_id == cut else [cut]
        beat(stage, engine_id, broken_generation=1, data_unreachable=unreachable)


def test_a_broken_data_link_re_forms_on_the_engines_that_reach_one_another_and_fences_the_other(
    stage: Scenario,
) -> None:
    cut = stage.serving[2].engine_id
    cut_data(stage, cut)
    (job_id,) = stage.liveness_pass().jobs
    row = stage.engine_rows()[cut]
    assert row.state == EngineState.fenced.value and stage.launcher.released == []  # fenced, not stopped
    asyncio.run(stage.run(job_id))
    job = stage.job(job_id)
    assert job.state == JobState.succeeded, job.error
    assert job.to_dp_size == 2 and cut not in {r["engine_id"] for r in job.engine_results}
    beat(stage, cut, data_unreachable=[s.engine_id for s in stage.serving[:2]])  # still cut off
    assert stage.engine_rows()[cut].state == EngineState.fenced.value
    stage.liveness_pass()  # heartbeating, so never written off by the silence grace
    jobs = stage.liveness_pass(grace_s=5.0).jobs
    assert jobs == [], [stage.job(j).reason for j in jobs]
    assert stage.engine_rows()[cut].state == EngineState.fenced.value
    beat(stage, cut)  # its network is back: it reaches its peers again
    assert stage.engine_rows()[cut].state == EngineState.idle.value
    (grow_id,) = stage.liveness_pass().jobs
    asyncio.run(stage.run(grow_id))
    assert stage.job(grow_id).state == JobState.succeeded
    assert stage.deployment().current_dp_size == 3 and stage.launcher.started == []  # re-admitted


def test_heartbeats_carry_what_the_data_network_reaches(stage: Scenario) -> None:
    agent = stage.serving[0].engine_id
    beat(stage, agent, group_steps=42, data_unreachable=[stage.serving[1].engine_id])
    with Session(stage.db) as session:
        row = session.exec(select(Engine).where(Engine.id == agent)).one()
    assert (row.group_steps, row.data_unreachable) == (42, [stage.serving[1].engine_id])


def test_a_coordinator_that_hears_no_engine_at_all_marks_none_lost(
    stage: Scenario, client: TestClient
) -> None:
    """Every heartbeat stopped together: the coordinator's own network is cut (issue 24), so nothing is
    written off; every member is a lost link (jobs refused), and each clears as it is heard again."""
    members = [a.engine_id for a in stage.serving]
    for engine_id in members:
        silence(stage, engine_id, seconds=20.0)
    expire(stage)  # timeout 15 s: the freshest heartbeat (20 s) is older than half of it
    rows = stage.engine_rows()
    assert all(rows[m].state == EngineState.serving.value and rows[m].link_lost_at for m in members), rows
    shown = client.get("/v1/deployments/demo").json()
    assert shown["status"] == "ready" and {c["engine_id"] for c in shown["conditions"]} == set(members)
    assert stage.liveness_pass().jobs == []
    for engine_id in members:
        beat(stage, engine_id)
    assert client.get("/v1/deployments/demo").json()["conditions"] == []
