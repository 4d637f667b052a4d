"""Heartbeat expiry, written: an engine silent for longer than `EPCTL_HEARTBEAT_TIMEOUT_S` becomes
unreachable; losing a member degrades its deployment, with its reason, in the same transaction; each is
announced once (`engine.unreachable`); a heartbeat that arrives while a pass judges wins. The rules
themselves (the timeout, the coordinator's start, a deaf coordinator) are rows of
tests/runner/test_liveness_rules.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.backends.reference.liveness.controller import Liveness
from app.backends.reference.liveness.view import Rules
from app.backends.reference.record import JobRecord
from app.core.clock import utc_now
from app.core.runner_settings import RunnerSettings
from app.deployments.engines.models import Engine
from app.deployments.engines.service import record_heartbeat
from app.deployments.models import Deployment
from app.runner.loop import JobRunner
from app.webhooks.models import EventType, OutboxEvent
from engine_agent.protocol import AgentHeartbeat, AgentState
from tests.support.factories import make_deployment, register_engines


def deployment_with(db: DbEngine, *, silent: list[int], serving: int = 2, idle: int = 1) -> str:
    """Engines 0..serving-1 serve generation 1, the rest are idle; those in `silent` last beat a
    minute ago, the others just now. It only reports a loss (`on_engine_loss: none`: no self-heal
    writes an engine off)."""
    with Session(db, expire_on_commit=False) as session:
        deployment = make_deployment(session, "demo")
        deployment.on_engine_loss = "none"
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


async def alive(url: str) -> bool:
    """The probe's answer for every engine here: not gone (they are rows, no process listens)."""
    return False


def controller(db: DbEngine, heartbeat_timeout_s: float = 15.0) -> Liveness:
    """A coordinator that has been watching for longer than the timeout."""
    rules = Rules(heartbeat_timeout_s=heartbeat_timeout_s)
    since = utc_now() - timedelta(seconds=3600)
    return Liveness(JobRecord(db), {}, rules, probe=alive, watching_since=since)


def tick(db: DbEngine, heartbeat_timeout_s: float = 15.0) -> None:
    """One liveness pass by such a coordinator."""
    asyncio.run(controller(db, heartbeat_timeout_s).tick())


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


def test_an_engine_is_announced_once(db_engine: DbEngine) -> None:
    deployment_with(db_engine, silent=[1])
    tick(db_engine)
    tick(db_engine)
    assert list(announced(db_engine)) == ["demo-engine-1"]


def test_the_runners_loop_expires_silent_engines(db_engine: DbEngine) -> None:
    deployment_id = deployment_with(db_engine, silent=[1])
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
    """One pass writes the loss and the status in one transaction: no reader sees `degraded` without a
    reason (one transaction, one `deployment.degraded` event)."""
    deployment_id = deployment_with(db_engine, silent=[1])
    tick(db_engine)
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
    """Its own network was cut (issue 24): it remembers when it last heard nobody, and when the first
    heartbeat comes back, the others, not heard yet, are not marked lost until a full timeout later."""
    deployment_id = deployment_with(db_engine, silent=[0, 1, 2])
    liveness = controller(db_engine)
    asyncio.run(liveness.tick())
    assert liveness.deaf_at is not None
    with Session(db_engine) as session:  # the network is back: one engine is heard first
        beat = AgentHeartbeat(state=AgentState.serving, generation=1, rank=0, world_size=2)
        record_heartbeat(session, engine_id="demo-engine-0", heartbeat=beat)
    asyncio.run(liveness.tick())
    status, engines = states(db_engine, deployment_id)
    assert status == "ready" and "unreachable" not in engines.values(), engines
    liveness.deaf_at -= timedelta(seconds=16)  # a full timeout later, still silent: lost as always
    asyncio.run(liveness.tick())
    assert {k for k, v in states(db_engine, deployment_id)[1].items() if v == "unreachable"} == {
        "demo-engine-1",
        "demo-engine-2",
    }


def test_a_heartbeat_that_arrives_while_a_pass_judges_wins(db_engine: DbEngine) -> None:
    """The pass writes a lost engine only if its row is still what was observed (its last heartbeat):
    an engine heard in between is not marked, and the verdict is dropped whole for the next pass."""
    deployment_id = deployment_with(db_engine, silent=[1])
    liveness = controller(db_engine)

    async def go() -> None:
        views = await liveness.record.run_in_session(liveness._observe)
        with Session(db_engine) as session:  # heard between the observation and the write
            beat = AgentHeartbeat(state=AgentState.serving, generation=1, rank=1, world_size=2)
            record_heartbeat(session, engine_id="demo-engine-1", heartbeat=beat)
        done = await liveness._judge_and_act(views)
        assert not done.acted["demo"].applied

    asyncio.run(go())
    assert states(db_engine, deployment_id) == (
        "ready",
        {"demo-engine-0": "serving", "demo-engine-1": "serving", "demo-engine-2": "idle"},
    )
    assert announced(db_engine) == {}


def test_a_pass_over_a_steady_deployment_writes_nothing_and_commits_nothing(db_engine: DbEngine) -> None:
    """Issue 37: a verdict with nothing to write costs no worker thread and no transaction (before: a
    deployment read, its active job read and a commit per deployment every pass); a silent engine in
    the next pass is still written."""
    import sqlalchemy as sa

    deployment_id = deployment_with(db_engine, silent=[])
    liveness = controller(db_engine)
    commits: list[object] = []

    def committed(connection: object) -> None:
        commits.append(connection)

    sa.event.listen(db_engine, "commit", committed)
    try:

        async def go() -> None:
            for _ in range(2):
                await liveness.tick()

        asyncio.run(go())
    finally:
        sa.event.remove(db_engine, "commit", committed)
    assert commits == []
    assert states(db_engine, deployment_id)[1]["demo-engine-0"] == "serving"
    with Session(db_engine) as session:
        row = session.get(Engine, "demo-engine-1")
        assert row is not None
        row.last_heartbeat_at = utc_now() - timedelta(seconds=60)
        session.add(row)
        session.commit()
    asyncio.run(liveness.tick())
    assert states(db_engine, deployment_id)[1]["demo-engine-1"] == "unreachable"
