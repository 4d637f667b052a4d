"""A stalled (frozen) member is fenced on its peers' evidence, not at its heartbeat timeout
(`app.backends.reference.liveness.engines`), and a starting coordinator checks the members it adopts
(`app.backends.reference.liveness.adoption`). Fenced is not dead: the engine is not stopped, and is
re-admitted by the grow-back if it comes back within the grace, written off and stopped after it. The
rules are rows of tests/runner/test_liveness_rules.py; here they are written and the jobs run, on fake
agents (tests/runner/fakes.py) and a real database.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.backends.reference.liveness.controller import Pass
from app.backends.reference.liveness.health import REASON_STALLED
from app.core.clock import utc_now
from app.deployments.engines.models import Engine, EngineState
from app.jobs.states import JobState
from tests.runner.scenario import Scenario, make_scenario


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    """Two engines serving generation 1 and one idle (local launcher, fake; `replace` by default)."""
    return make_scenario(db_engine)


def freeze(stage: Scenario, *, named_by_survivor: bool = True, heard_since: bool = False) -> str:
    """Rank 1 froze: its row still says serving on generation 1; rank 0 left the broken group and
    reported it, naming rank 1 unresponsive (unless not `named_by_survivor`)."""
    frozen, survivor = stage.serving[1], stage.serving[0]
    survivor.rank, survivor.generation, survivor.world_size = None, 0, 0
    now = utc_now()
    with Session(stage.db) as session:
        kept = session.get(Engine, survivor.engine_id)
        assert kept is not None
        kept.state, kept.dp_rank, kept.generation = EngineState.idle.value, None, 0
        kept.broken_generation, kept.broken_reported_at = 1, now
        kept.unresponsive_peers = [frozen.engine_id] if named_by_survivor else []
        session.add(kept)
        row = session.get(Engine, frozen.engine_id)
        assert row is not None
        row.last_heartbeat_at = now + timedelta(seconds=1) if heard_since else now - timedelta(seconds=3)
        session.add(row)
        session.commit()
    return frozen.engine_id


def fence_and_heal(stage: Scenario, *, grace_s: float = 15.0) -> Pass:
    """One liveness pass: fence, follow health, heal."""
    return stage.liveness_pass(grace_s=grace_s)


def test_a_member_every_survivor_names_is_fenced_at_once_and_the_survivors_serve_again(
    stage: Scenario,
) -> None:
    frozen = freeze(stage)
    healing = fence_and_heal(stage)
    row = stage.engine_rows()[frozen]
    assert (row.state, row.dp_rank) == (EngineState.fenced.value, None)
    assert stage.launcher.released == []  # fenced, not stopped: it may come back
    detail = stage.deployment().status_detail
    assert detail is not None and detail["reason"] == REASON_STALLED and frozen in detail["message"]
    (job_id,) = healing.jobs
    assert frozen in (stage.job(job_id).reason or "")
    asyncio.run(stage.run(job_id))
    assert stage.job(job_id).state == JobState.succeeded, stage.job(job_id).error
    deployment = stage.deployment()
    assert (deployment.current_dp_size, deployment.generation, deployment.status) == (1, 2, "ready")


@pytest.mark.parametrize("why", ["not named", "heard from since"])
def test_no_fence_without_the_evidence(stage: Scenario, why: str) -> None:
    frozen = freeze(stage, named_by_survivor=why != "not named", heard_since=why == "heard from since")
    fence_and_heal(stage)
    assert stage.engine_rows()[frozen].state == EngineState.serving.value


def shrink_after_the_freeze(stage: Scenario) -> str:
    frozen = freeze(stage)
    (job_id,) = fence_and_heal(stage).jobs
    asyncio.run(stage.run(job_id))
    assert stage.job(job_id).state == JobState.succeeded
    return frozen


def test_a_fenced_engine_that_comes_back_is_re_admitted_by_the_grow_back(stage: Scenario) -> None:
    frozen = shrink_after_the_freeze(stage)
    spare = stage.idle[0]
    spare.faults.add("unreachable")  # the spare is gone: the grow-back can only use the thawed engine
    with Session(stage.db) as session:
        spare_row = session.get(Engine, spare.engine_id)
        assert spare_row is not None
        spare_row.state = EngineState.left.value
        session.add(spare_row)
        session.commit()
    assert fence_and_heal(stage).jobs == []  # it may still come back: no replacement launched yet
    agent = stage.agents[frozen]  # thawed: it left its broken group and heartbeats idle
    agent.rank, agent.generation, agent.world_size = None, 0, 0
    with Session(stage.db) as session:
        row = session.get(Engine, frozen)
        assert row is not None
        row.state, row.generation, row.last_heartbeat_at = EngineState.idle.value, 0, utc_now()
        session.add(row)
        session.commit()
    (grow_id,) = fence_and_heal(stage).jobs
    asyncio.run(stage.run(grow_id))
    assert stage.job(grow_id).state == JobState.succeeded, stage.job(grow_id).error
    assert stage.launcher.started == [] and stage.launcher.released == []
    assert (agent.generation, agent.rank) == (3, 1)  # re-admitted, no engine launched
    assert stage.deployment().current_dp_size == 2


def test_a_fenced_engine_not_back_within_the_grace_is_written_off_and_stopped(stage: Scenario) -> None:
    frozen = shrink_after_the_freeze(stage)
    healing = fence_and_heal(stage, grace_s=0.0)
    assert stage.engine_rows()[frozen].state == EngineState.left.value
    assert stage.launcher.released == [frozen]
    if not healing.jobs:
        (grow_id,) = fence_and_heal(stage, grace_s=0.0).jobs
    else:
        (grow_id,) = healing.jobs
    asyncio.run(stage.run(grow_id))
    assert stage.job(grow_id).state == JobState.succeeded
    assert stage.deployment().current_dp_size == 2


def test_adoption_keeps_what_answers_and_corrects_the_record_for_what_does_not(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine, serving=3, idle=0)
    gone, silent = stage.serving[1], stage.serving[2]
    gone.faults.add("unreachable")
    silent.faults.add("silent")

    async def adopt() -> list[object]:
        async with stage.fleet() as fleet:
            return list(await stage.liveness.adopt(fleet))

    (adoption,) = asyncio.run(adopt())
    assert not adoption.adopted  # type: ignore[attr-defined]
    assert (adoption.gone, adoption.silent) == ([gone.engine_id], [silent.engine_id])  # type: ignore[attr-defined]
    rows = stage.engine_rows()
    # Gone: lost, and written off by self-healing in the same pass (stopped by its launcher).
    assert rows[gone.engine_id].state == EngineState.left.value and stage.launcher.released == [
        gone.engine_id
    ]
    assert rows[silent.engine_id].state == EngineState.fenced.value  # frozen: fenced, not stopped
    deployment = stage.deployment()
    assert deployment.status == "degraded" and deployment.status_detail is not None
    assert gone.engine_id in deployment.status_detail["message"]


def test_adoption_of_a_whole_deployment_changes_nothing(stage: Scenario) -> None:
    before = stage.engine_rows()

    async def adopt() -> list[object]:
        async with stage.fleet() as fleet:
            return list(await stage.liveness.adopt(fleet))

    (adoption,) = asyncio.run(adopt())
    assert adoption.adopted  # type: ignore[attr-defined]
    assert {k: v.state for k, v in stage.engine_rows().items()} == {k: v.state for k, v in before.items()}
    assert fence_and_heal(stage).jobs == []
    assert stage.deployment().status == "ready"


def test_a_job_names_the_engine_that_does_not_answer_not_the_peer_that_failed_because_of_it(
    stage: Scenario,
) -> None:
    """Rank 1 froze in prepare; rank 0's transfer from it broke first (an error of its own): the job's
    error names rank 1, which does not answer, with rank 0's failure in the message."""
    frozen, peer = stage.serving[1], stage.serving[0]
    peer.faults.add("fail_prepare")
    frozen.faults.add("hang_prepare")

    def freeze_now(operation: str) -> None:
        if operation == "prepare":
            frozen.faults.add("silent")

    frozen.before = freeze_now
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    assert job.error is not None and job.error["engine_id"] == frozen.engine_id, job.error
    assert job.error["type"] == "deadline-exceeded" and peer.engine_id in job.error["message"]
