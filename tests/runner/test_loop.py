"""The runner's loop, in process against FAKE agents: it claims a pending job and drives it to the end,
reconciles a job a dead coordinator left, and lets its leases go when it stops."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.jobs.states import TERMINAL_STATES, JobState
from app.runner.leases import Leases
from app.runner.loop import JobRunner
from tests.runner.scenario import Scenario, crashed_at, fast_settings, make_scenario


def loop_for(stage: Scenario, name: str = "loop-coordinator") -> JobRunner:
    settings = fast_settings(enabled=True, coordinator_id=name, poll_interval_s=0.05)
    return JobRunner(stage.db, launchers={"local": stage.launcher}, settings=settings, new_fleet=stage.fleet)


async def until_terminal(stage: Scenario, job_id: str, timeout_s: float = 30.0) -> JobState:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        state = JobState(stage.job(job_id).state)
        if state in TERMINAL_STATES:
            return state
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} still {stage.job(job_id).state}")


def test_the_loop_claims_a_pending_job_and_runs_it_to_the_end(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine)
    job_id = stage.new_job(3)
    runner = loop_for(stage)

    async def go() -> JobState:
        await runner.start()
        try:
            return await until_terminal(stage, job_id)
        finally:
            await runner.stop()

    assert asyncio.run(go()) == JobState.succeeded
    job = stage.job(job_id)
    assert job.lease_owner is None  # a terminal job holds no lease
    assert any("claimed by loop-coordinator" in str(e.message) for e in stage.events(job_id))


def test_the_loop_reconciles_a_job_whose_coordinator_died(db_engine: DbEngine, tmp_path: Path) -> None:
    stage, job_id = crashed_at(db_engine, tmp_path, "paused")
    runner = loop_for(stage, "successor")

    async def go() -> JobState:
        await runner.start()
        try:
            return await until_terminal(stage, job_id)
        finally:
            await runner.stop()

    assert asyncio.run(go()) == JobState.rolled_back
    assert not any(agent.paused for agent in stage.agents.values())


def test_a_stopped_loop_lets_its_leases_go_so_a_successor_reconciles_at_once(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine)
    stage.serving[0].faults.add("hang_prepare")  # the job stays in prepare while the loop stops
    job_id = stage.new_job(3)
    runner = loop_for(stage)

    async def go() -> None:
        await runner.start()
        while stage.serving[0].status is None:
            await asyncio.sleep(0.02)
        await runner.stop()

    asyncio.run(go())
    assert stage.job(job_id).state == JobState.preparing
    with Session(db_engine) as session:
        assert Leases("successor", lease_s=30.0).claim_stranded(session) == [job_id]


def test_a_loop_stopped_with_its_engines_ends_the_job_it_runs_before_commit(db_engine: DbEngine) -> None:
    """`epctl up` stops its engines right after its coordinator (`stop(end_jobs=True)`): a job handed
    over could never finish, so it is cancelled (rolled back on the agents) before the loop exits, not
    left `preparing` until the next start (issue 34)."""
    stage = make_scenario(db_engine)
    stage.serving[0].faults.add("hang_prepare")
    job_id = stage.new_job(3)
    runner = loop_for(stage)

    async def go() -> None:
        await runner.start()
        while stage.serving[0].status is None:
            await asyncio.sleep(0.02)
        await runner.stop(end_jobs=True)

    asyncio.run(go())
    job = stage.job(job_id)
    assert (job.state, job.lease_owner) == (JobState.cancelled, None)
    assert stage.serving[0].ops(job_id)[-1] == "abort"


def test_a_starting_runner_has_the_adoptions_verdict_before_it_returns(db_engine: DbEngine) -> None:
    """Issue 34: the lifespan awaits `start()` before it serves a request, so a restarted coordinator
    never answers `ready` for a deployment whose member does not answer (it read `ready`, 0 serving,
    for ~2 s, until the adoption that ran in the background decided)."""
    stage = make_scenario(db_engine, serving=3, idle=0)
    frozen = stage.serving[2]
    frozen.faults.add("silent")
    for survivor in stage.serving[:2]:  # their group broke on it while no coordinator ran
        survivor.rank, survivor.generation = None, 0
    runner = loop_for(stage, "restarted")

    async def go() -> tuple[str, str]:
        await runner.start()
        try:  # read before the loop gets a turn: only what start() awaited is there
            return stage.deployment().status, stage.engine_rows()[frozen.engine_id].state
        finally:
            await runner.stop()

    assert asyncio.run(go()) == ("degraded", "fenced")
