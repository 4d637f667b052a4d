"""Self-healing written and run (`app.backends.reference.liveness`: the judge's rules are the table in
tests/runner/test_liveness_rules.py): a pass's verdict goes through the one writers and the job it asks
for runs the real flow on fake agents (tests/runner/fakes.py) and a real database: a deployment that lost
a member forms a new generation on the survivors (`shrink`), then grows back to its size (`replace`); a
group broken under live engines is re-formed at its size; losing every engine launches fresh ones
(`replace`) or says why nothing can be done, once (`shrink`); failed recovery jobs are not retried
forever; the jobs record their recovery figures."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.backends.reference.liveness.controller import Pass
from app.backends.reference.liveness.probes import process_gone
from app.backends.reference.liveness.view import Rules
from app.backends.reference.record import degrade
from app.core.clock import utc_now
from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment, DeploymentStatus
from app.jobs.models import JobPublic, ReconfigurationJob
from app.jobs.states import JobState
from app.webhooks.models import OutboxEvent
from tests.runner.scenario import Scenario, make_scenario


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    """Two engines serving generation 1, one idle engine registered (local launcher, fake)."""
    return make_scenario(db_engine)


def lose_member(stage: Scenario, on_engine_loss: str | None = None) -> str:
    """Rank 1 dies (silent past the timeout: `unreachable`); rank 0's group broke with it (idle)."""
    lost, survivor = stage.serving[1], stage.serving[0]
    lost.faults.add("unreachable")
    survivor.rank, survivor.generation, survivor.world_size = None, 0, 0
    with Session(stage.db) as session:
        row = session.get(Engine, lost.engine_id)
        assert row is not None
        row.state = EngineState.unreachable.value
        row.last_heartbeat_at = utc_now() - timedelta(seconds=20)
        session.add(row)
        kept = session.get(Engine, survivor.engine_id)
        assert kept is not None
        kept.state, kept.dp_rank, kept.generation = EngineState.idle.value, None, 0
        session.add(kept)
        deployment = session.get(Deployment, stage.deployment_id)
        assert deployment is not None
        deployment.on_engine_loss = on_engine_loss
        session.add(deployment)
        session.commit()
    return lost.engine_id


def heal_once(stage: Scenario) -> Pass:
    """One liveness pass; an engine's process is gone when its fake agent is `unreachable`."""
    return stage.liveness_pass()


MAX_ATTEMPTS = Rules().max_attempts


def test_shrink_forms_a_new_generation_on_the_survivors(stage: Scenario) -> None:
    lost = lose_member(stage, "shrink")
    healing = heal_once(stage)
    (job_id,) = healing.jobs
    assert stage.engine_rows()[lost].state == "left"
    assert stage.launcher.released == [lost]  # stopped wherever it still runs (a frozen one too)
    asyncio.run(stage.run(job_id))
    job = stage.job(job_id)
    assert job.state == JobState.succeeded, job.error
    assert job.requested_by == "self-heal" and lost in (job.reason or "")
    deployment = stage.deployment()
    assert (deployment.current_dp_size, deployment.generation, deployment.heal_target_dp_size) == (1, 2, None)
    assert (stage.serving[0].generation, stage.serving[0].rank) == (2, 0)
    assert heal_once(stage).jobs == []  # healed: nothing more to do


def test_replace_shrinks_then_grows_back_to_the_size_it_had(stage: Scenario) -> None:
    lose_member(stage)  # the local launcher's default: replace
    (shrink_id,) = heal_once(stage).jobs
    asyncio.run(stage.run(shrink_id))
    assert stage.job(shrink_id).state == JobState.succeeded
    assert (stage.deployment().current_dp_size, stage.deployment().heal_target_dp_size) == (1, 2)
    (grow_id,) = heal_once(stage).jobs
    asyncio.run(stage.run(grow_id))
    grow = stage.job(grow_id)
    assert grow.state == JobState.succeeded, grow.error
    assert grow.requested_by == "self-heal" and grow.to_dp_size == 2
    assert heal_once(stage).jobs == []  # at its size: the target is dropped
    deployment = stage.deployment()
    assert (deployment.current_dp_size, deployment.heal_target_dp_size) == (2, None)


def test_the_new_generation_waits_until_no_survivor_is_left_on_the_broken_one(stage: Scenario) -> None:
    """A survivor still blocked in a collective of the broken group reports the old generation until its
    deadline: the lost engine is written off at once, the job waits for that survivor to leave."""
    lost = lose_member(stage, "shrink")
    blocked = stage.serving[0]
    with Session(stage.db) as session:
        row = session.get(Engine, blocked.engine_id)
        assert row is not None
        row.state, row.dp_rank, row.generation = EngineState.serving.value, 0, 1
        session.add(row)
        session.commit()
    assert heal_once(stage).jobs == []
    assert stage.engine_rows()[lost].state == "left" and lost in (stage.deployment().heal_lost or "")
    with Session(stage.db) as session:  # its collective deadline: it left the group
        row = session.get(Engine, blocked.engine_id)
        assert row is not None
        row.state, row.dp_rank, row.generation = EngineState.idle.value, None, 0
        session.add(row)
        session.commit()
    (job_id,) = heal_once(stage).jobs
    assert lost in (stage.job(job_id).reason or "")


@pytest.mark.parametrize(("on_engine_loss", "heals"), [("shrink", True), ("none", False)])
def test_a_switch_failed_part_way_with_every_engine_alive_is_healed(
    stage: Scenario, on_engine_loss: str, heals: bool
) -> None:
    """A member frozen (SIGSTOP) in the commit window and thawed once the job failed: no engine stays
    silent, so none is written off, but the generation broke (every engine idle): self-heal re-forms a
    generation on the live engines at the deployment's size."""
    with Session(stage.db) as session:
        deployment = session.get(Deployment, stage.deployment_id)
        assert deployment is not None
        deployment.on_engine_loss = on_engine_loss
        session.add(deployment)
        session.commit()
    for agent in stage.serving:  # each left the broken group (its collective deadline)
        agent.rank, agent.generation, agent.world_size = None, 0, 0
    with Session(stage.db) as session:
        degrade(
            session,
            stage.deployment_id,
            {a.engine_id: {"generation": 0, "state": "idle", "rank": None} for a in stage.serving},
        )
        session.commit()
    jobs = heal_once(stage).jobs  # the pass: members-missing, every engine heartbeating, then the heal
    if not heals:
        assert jobs == [] and stage.deployment().heal_lost is None
        return
    (job_id,) = jobs
    asyncio.run(stage.run(job_id))
    assert stage.job(job_id).state == JobState.succeeded, stage.job(job_id).error
    deployment = stage.deployment()
    assert (deployment.current_dp_size, deployment.generation) == (2, 2)
    assert heal_once(stage).jobs == [] and stage.deployment().heal_lost is None


def test_none_only_reports(stage: Scenario) -> None:
    lost = lose_member(stage, "none")
    assert heal_once(stage).jobs == []
    assert stage.engine_rows()[lost].state == "unreachable"


def test_the_default_is_replace_where_the_launcher_starts_engines_else_shrink() -> None:
    from app.deployments.models import OnEngineLoss, effective_on_engine_loss

    assert effective_on_engine_loss(None, "local") is OnEngineLoss.replace
    assert effective_on_engine_loss(None, "ray") is OnEngineLoss.replace
    assert effective_on_engine_loss(None, "static") is OnEngineLoss.shrink
    assert effective_on_engine_loss("none", "local") is OnEngineLoss.none


def test_the_jobs_record_the_time_to_detect_and_to_serving_again(stage: Scenario) -> None:
    lost = lose_member(stage)
    heard_last = stage.engine_rows()[lost].last_heartbeat_at
    (shrink_id,) = heal_once(stage).jobs
    asyncio.run(stage.run(shrink_id))
    shrink = stage.job(shrink_id)
    assert shrink.loss_at == heard_last  # the loss happened after its last heartbeat
    assert shrink.time_to_detect_ms is not None and shrink.time_to_serving_ms is not None
    assert 20_000 <= shrink.time_to_detect_ms <= shrink.time_to_serving_ms  # silent 20 s when written off
    public = JobPublic.of(shrink, deployment="demo")  # on the API record
    assert (public.loss_at, public.time_to_serving_ms) == (heard_last, shrink.time_to_serving_ms)
    (grow_id,) = heal_once(stage).jobs  # replace: back to full size, counted from the same loss
    asyncio.run(stage.run(grow_id))
    grow = stage.job(grow_id)
    assert grow.loss_at == heard_last and grow.time_to_detect_ms is None
    assert grow.time_to_serving_ms is not None and grow.time_to_serving_ms >= shrink.time_to_serving_ms
    assert heal_once(stage).jobs == [] and stage.deployment().heal_loss_at is None  # healed: nothing kept


def break_group_under_live_engines(stage: Scenario, on_engine_loss: str | None) -> None:
    """Every member left generation 1 (a collective failed) but heartbeats; health said `degraded`."""
    with Session(stage.db) as session:
        for agent in stage.serving:
            agent.rank, agent.generation, agent.world_size = None, 0, 0
            row = session.get(Engine, agent.engine_id)
            assert row is not None
            row.state, row.dp_rank, row.generation = EngineState.idle.value, None, 0
            session.add(row)
        deployment = session.get(Deployment, stage.deployment_id)
        assert deployment is not None
        deployment.on_engine_loss = on_engine_loss
        deployment.status = DeploymentStatus.degraded.value
        deployment.status_detail = {"reason": "members-missing", "message": "0 of 2", "since": None}
        session.add(deployment)
        session.commit()


@pytest.mark.parametrize("on_engine_loss", ["shrink", "replace"])
def test_a_group_broken_under_live_engines_is_re_formed_at_its_size(
    stage: Scenario, on_engine_loss: str
) -> None:
    break_group_under_live_engines(stage, on_engine_loss)
    (job_id,) = heal_once(stage).jobs
    asyncio.run(stage.run(job_id))
    job = stage.job(job_id)
    assert job.state == JobState.succeeded, job.error
    assert (job.requested_by, job.from_dp_size, job.to_dp_size) == ("self-heal", 2, 2)
    assert job.time_to_detect_ms is not None and job.time_to_serving_ms is not None
    deployment = stage.deployment()
    assert (deployment.current_dp_size, deployment.generation) == (2, 2)
    assert heal_once(stage).jobs == []


@pytest.fixture
def alone(db_engine: DbEngine) -> Scenario:
    """Two engines serving generation 1 and no idle one."""
    return make_scenario(db_engine, idle=0)


def lose_everything(stage: Scenario, on_engine_loss: str) -> None:
    with Session(stage.db) as session:
        for agent in stage.serving:
            agent.faults.add("unreachable")
            row = session.get(Engine, agent.engine_id)
            assert row is not None
            row.state = EngineState.unreachable.value
            row.last_heartbeat_at = utc_now() - timedelta(seconds=20)
            session.add(row)
        deployment = session.get(Deployment, stage.deployment_id)
        assert deployment is not None
        deployment.on_engine_loss = on_engine_loss
        deployment.status = DeploymentStatus.degraded.value  # as marking them unreachable did
        session.add(deployment)
        session.commit()


def test_losing_every_engine_with_replace_launches_fresh_ones_back_to_the_size(alone: Scenario) -> None:
    lose_everything(alone, "replace")
    (job_id,) = heal_once(alone).jobs
    asyncio.run(alone.run(job_id))
    job = alone.job(job_id)
    assert job.state == JobState.succeeded, job.error
    assert (job.from_dp_size, job.to_dp_size) == (2, 2)
    assert len(alone.launcher.started) == 2
    assert alone.deployment().current_dp_size == 2
    assert heal_once(alone).jobs == []


def degraded_events(stage: Scenario) -> list[OutboxEvent]:
    with Session(stage.db) as session:
        rows = session.exec(select(OutboxEvent).where(OutboxEvent.type == "deployment.degraded")).all()
        return [r for r in rows if r.deployment_id == stage.deployment_id]


def test_losing_every_engine_with_shrink_says_so_once_and_tries_nothing(alone: Scenario) -> None:
    lose_everything(alone, "shrink")
    assert heal_once(alone).jobs == []
    deployment = alone.deployment()
    assert deployment.status == "degraded"
    assert deployment.status_detail is not None and deployment.status_detail["reason"] == "no-survivors"
    assert "no survivor" in deployment.status_detail["message"]
    assert len(degraded_events(alone)) == 1
    assert heal_once(alone).jobs == [] and len(degraded_events(alone)) == 1  # said once


def test_self_healing_stops_after_failed_attempts_in_a_row(stage: Scenario) -> None:
    break_group_under_live_engines(stage, "shrink")
    for agent in stage.serving:
        agent.faults.add("fail_prepare")
    for attempt in range(MAX_ATTEMPTS):
        (job_id,) = heal_once(stage).jobs
        asyncio.run(stage.run(job_id))
        assert stage.job(job_id).state == JobState.rolled_back
        with Session(stage.db) as session:  # as if the retry pause had passed
            row = session.get(ReconfigurationJob, job_id)
            assert row is not None
            row.updated_at = utc_now() - timedelta(minutes=1)
            session.add(row)
            session.commit()
        if attempt < MAX_ATTEMPTS - 1:
            # Health says `members-missing` again; the next pass retries.
            break_group_under_live_engines(stage, "shrink")
    assert heal_once(stage).jobs == []
    detail = stage.deployment().status_detail
    assert detail is not None and detail["reason"] == "self-heal-stopped"
    assert heal_once(stage).jobs == []


def test_a_dead_member_is_found_before_its_heartbeat_timeout(stage: Scenario) -> None:
    """The survivor left the broken group; the dead member still looks `serving` in the record (its
    heartbeat timeout has not passed), but nothing listens at its URL: written off at once."""
    lost, survivor = stage.serving[1], stage.serving[0]
    lost.faults.add("unreachable")
    with Session(stage.db) as session:
        kept = session.get(Engine, survivor.engine_id)
        assert kept is not None
        kept.state, kept.dp_rank, kept.generation = EngineState.idle.value, None, 0
        session.add(kept)
        row = session.get(Engine, lost.engine_id)
        assert row is not None
        row.last_heartbeat_at = utc_now() - timedelta(seconds=1)  # well within its heartbeat timeout
        session.add(row)
        session.commit()
    survivor.rank, survivor.generation, survivor.world_size = None, 0, 0
    (job_id,) = heal_once(stage).jobs
    assert stage.engine_rows()[lost.engine_id].state == "left"
    assert lost.engine_id in (stage.job(job_id).reason or "")


def test_the_real_probe_counts_only_a_refused_connection_as_gone() -> None:
    import socket

    with socket.socket() as listener:  # bound and listening, never answering: a frozen engine
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        frozen = f"http://127.0.0.1:{listener.getsockname()[1]}"
        assert asyncio.run(process_gone(frozen)) is False
    assert asyncio.run(process_gone(frozen)) is True  # closed: nothing listens there now


def test_losing_the_only_engine_takes_an_idle_spare(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine, serving=1, idle=1)
    lose_everything(stage, "shrink")
    (job_id,) = heal_once(stage).jobs
    asyncio.run(stage.run(job_id))
    job = stage.job(job_id)
    assert job.state == JobState.succeeded, job.error
    assert (job.from_dp_size, job.to_dp_size) == (1, 1)
    assert (stage.idle[0].generation, stage.idle[0].rank) == (2, 0)


def test_a_failed_grow_back_is_tried_again_until_the_deployment_has_its_size(stage: Scenario) -> None:
    lose_member(stage)  # replace
    (shrink_id,) = heal_once(stage).jobs
    asyncio.run(stage.run(shrink_id))
    spare = stage.idle[0]
    spare.faults.add("fail_prepare")  # the engine it grows onto fails (as a launch that times out)
    (grow_id,) = heal_once(stage).jobs
    asyncio.run(stage.run(grow_id))
    assert stage.job(grow_id).state == JobState.rolled_back
    assert stage.deployment().heal_target_dp_size == 2  # kept: the size it had is still owed
    assert heal_once(stage).jobs == []  # not at once: after the retry pause
    with Session(stage.db) as session:
        row = session.get(ReconfigurationJob, grow_id)
        assert row is not None
        row.updated_at = utc_now() - timedelta(minutes=1)
        session.add(row)
        session.commit()
    spare.faults.clear()
    (again_id,) = heal_once(stage).jobs
    asyncio.run(stage.run(again_id))
    again = stage.job(again_id)
    assert again.state == JobState.succeeded, again.error
    assert again.time_to_serving_ms is not None  # counted from the same loss
    assert stage.deployment().current_dp_size == 2
    assert heal_once(stage).jobs == [] and stage.deployment().heal_target_dp_size is None
