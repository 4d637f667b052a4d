"""Heartbeat expiry: an engine silent for longer than `EPCTL_HEARTBEAT_TIMEOUT_S` becomes unreachable;
losing a member degrades its deployment; each is announced (`engine.unreachable`)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.backends.reference.record import JobRecord
from app.core.clock import utc_now
from app.core.runner_settings import RunnerSettings
from app.deployments.engines.models import Engine
from app.deployments.engines.service import record_heartbeat
from app.deployments.models import Deployment
from app.runner.loop import JobRunner
from app.runner.scheduled import Hearing, expire_heartbeats, health_pass
from app.webhooks.models import EventType, OutboxEvent
from engine_agent.protocol import AgentHeartbeat, AgentState
from tests.support.factories import make_deployment, register_engines


def deployment_with(db: DbEngine, *, silent: list[int], serving: int = 2, idle: int = 1) -> str:
    """Engines 0..serving-1 serve generation 1, the rest are idle; those in `silent` last beat a
    minute ago, the others just now."""
    with Session(db, expire_on_commit=False) as session:
        deployment = make_deployment(session, "demo")
        for index, row in enumerate(register_engines(session, deployment, serving + idle)):
            member = index < serving
            row.state = "serving" if member else "idle"
            row.dp_rank = index if member else None
            row.generation = 1 if member else 0
            if index in silent:
                row.last_heartbeat_at = utc_now() - timedelta(seconds=60)
            session.add(row)
        deployment.current_dp_size, deployment.generation = serving, 1
        session.add(deployment)
        session.commit()
        return deployment.id


def tick(db: DbEngine, heartbeat_timeout_s: float = 15.0) -> None:
    """One heartbeat check, by a coordinator that has been watching for longer than the timeout."""
    asyncio.run(expire_heartbeats(JobRecord(db), heartbeat_timeout_s))


def states(db: DbEngine, deployment_id: str) -> tuple[str, dict[str, str]]:
    with Session(db) as session:
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None
        rows = session.exec(select(Engine).where(Engine.deployment_id == deployment_id)).all()
        return deployment.status, {row.id: row.state for row in rows}


def announced(db: DbEngine) -> dict[str, dict[str, object]]:
    with Session(db) as session:
        events = session.exec(
            select(OutboxEvent).where(OutboxEvent.type == EventType.engine_unreachable)
        ).all()
        return {str(e.payload["data"]["id"]): e.payload["data"] for e in events}


def test_a_silent_member_becomes_unreachable_and_degrades_its_deployment(db_engine: DbEngine) -> None:
    deployment_id = deployment_with(db_engine, silent=[1])
    tick(db_engine)
    status, engines = states(db_engine, deployment_id)
    assert status == "degraded"
    assert engines == {"demo-engine-0": "serving", "demo-engine-1": "unreachable", "demo-engine-2": "idle"}
    events = announced(db_engine)
    assert list(events) == ["demo-engine-1"]
    assert events["demo-engine-1"]["member"] is True
    assert events["demo-engine-1"]["deployment_status"] == "degraded"
    assert events["demo-engine-1"]["state"] == "unreachable"


def test_a_silent_idle_engine_becomes_unreachable_without_degrading(db_engine: DbEngine) -> None:
    deployment_id = deployment_with(db_engine, silent=[2])
    tick(db_engine)
    status, engines = states(db_engine, deployment_id)
    assert (status, engines["demo-engine-2"]) == ("ready", "unreachable")
    assert announced(db_engine)["demo-engine-2"]["member"] is False


def test_engines_heard_from_within_the_timeout_are_left_alone(db_engine: DbEngine) -> None:
    deployment_id = deployment_with(db_engine, silent=[0, 1])
    tick(db_engine, heartbeat_timeout_s=120.0)
    status, engines = states(db_engine, deployment_id)
    assert status == "ready" and "unreachable" not in engines.values()
    assert announced(db_engine) == {}


def test_an_engine_is_announced_once(db_engine: DbEngine) -> None:
    deployment_with(db_engine, silent=[1])
    tick(db_engine)
    tick(db_engine)
    assert list(announced(db_engine)) == ["demo-engine-1"]


def test_silence_counts_from_when_the_coordinator_started_watching(db_engine: DbEngine) -> None:
    """Agents cannot reach a coordinator that is down: a (re)started one does not count that silence."""
    deployment_with(db_engine, silent=[1])
    record = JobRecord(db_engine)
    just_started = asyncio.run(expire_heartbeats(record, 15.0, watching_since=utc_now()))
    assert just_started == [] and announced(db_engine) == {}
    long_running = asyncio.run(
        expire_heartbeats(record, 15.0, watching_since=utc_now() - timedelta(seconds=60))
    )
    assert [engine.id for engine in long_running] == ["demo-engine-1"]


def test_the_runners_loop_expires_silent_engines(db_engine: DbEngine) -> None:
    deployment_id = deployment_with(db_engine, silent=[1])
    with Session(db_engine) as session:  # report only: no self-heal writes the engine off
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None
        deployment.on_engine_loss = "none"
        session.add(deployment)
        session.commit()
    runner = JobRunner(
        db_engine,
        launchers={},
        heartbeat_timeout_s=1.0,
        settings=RunnerSettings(enabled=False, heartbeat_check_interval_s=0.05),
    )

    async def go() -> None:
        for _ in range(400):  # until engine 1 expires (1 s after the runner started), 20 s at most
            with Session(db_engine) as session:  # engine 0 keeps being heard from
                beat = AgentHeartbeat(state=AgentState.serving, generation=1, rank=0, world_size=2)
                record_heartbeat(session, engine_id="demo-engine-0", heartbeat=beat)
            await runner.tick()
            if states(db_engine, deployment_id)[1]["demo-engine-1"] == "unreachable":
                return
            await asyncio.sleep(0.05)

    asyncio.run(go())
    status, engines = states(db_engine, deployment_id)
    assert (status, engines["demo-engine-1"], engines["demo-engine-0"]) == (
        "degraded",
        "unreachable",
        "serving",
    )


def test_with_the_health_pass_a_lost_member_degrades_its_deployment_with_the_reason_at_once(
    db_engine: DbEngine,
) -> None:
    """The runner's pass runs the health pass in the expiry's own transaction: no reader sees
    `degraded` without a reason (one transaction, one `deployment.degraded` event)."""
    deployment_id = deployment_with(db_engine, silent=[1])
    record, suspects = JobRecord(db_engine), dict[str, float]()
    asyncio.run(expire_heartbeats(record, 15.0, follow=lambda session: health_pass(session, suspects, 0.0)))
    with Session(db_engine) as session:
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None and deployment.status == "degraded"
        assert deployment.status_detail is not None
        assert deployment.status_detail["reason"] == "engine-unreachable", deployment.status_detail
        degraded = session.exec(
            select(OutboxEvent).where(OutboxEvent.type == EventType.deployment_degraded)
        ).all()
    assert len(degraded) == 1


def test_a_coordinator_that_heard_nobody_gives_every_engine_a_full_timeout_once_it_hears_again(
    db_engine: DbEngine,
) -> None:
    """Its own network was cut (issue 24): when the first heartbeat comes back, the others, not heard
    yet, are not marked lost; each gets one timeout from the last moment the coordinator was deaf."""
    deployment_id = deployment_with(db_engine, silent=[0, 1, 2])
    record, hearing = JobRecord(db_engine), Hearing()
    assert asyncio.run(expire_heartbeats(record, 15.0, hearing=hearing)) == []
    assert hearing.deaf_at is not None
    with Session(db_engine) as session:  # the network is back: one engine is heard first
        beat = AgentHeartbeat(state=AgentState.serving, generation=1, rank=0, world_size=2)
        record_heartbeat(session, engine_id="demo-engine-0", heartbeat=beat)
    assert asyncio.run(expire_heartbeats(record, 15.0, hearing=hearing)) == []
    status, engines = states(db_engine, deployment_id)
    assert status == "ready" and "unreachable" not in engines.values(), engines
    hearing.deaf_at -= timedelta(seconds=16)  # a full timeout later, still silent: lost as always
    assert {e.id for e in asyncio.run(expire_heartbeats(record, 15.0, hearing=hearing))} == {
        "demo-engine-1",
        "demo-engine-2",
    }
