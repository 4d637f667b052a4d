"""The flow's step tables and failure rules, against FAKE agents (tests/runner/fakes.py) and a real
database: every rule of DESIGN.md's principles 4 and 5, for both strategies, and cancellation."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.backends.reference.flow import OnFailure, steps_for
from app.jobs.models import ReconfigurationJob
from app.jobs.states import JobState
from engine_agent.protocol import AgentState, CommitMode, Operation, ReconfigPhase, Strategy
from tests.runner.fakes import INJECTED, FakeAgent
from tests.runner.scenario import Scenario, fast_settings, make_scenario


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    """Two engines serving generation 1, one idle engine registered."""
    return make_scenario(db_engine)


def test_every_strategy_rolls_back_before_the_pause_resumes_after_it_and_degrades_after_the_switch() -> None:
    for strategy in Strategy:
        steps = steps_for(strategy, CommitMode.coordinator)
        rules = [step.on_failure for step in steps]
        pause = [step.name for step in steps].index(Operation.pause)
        assert all(rule is OnFailure.roll_back for rule in rules[:pause]), strategy
        assert all(rule is OnFailure.resume_all for rule in rules[pause:-1]), strategy
        assert steps[-1].name is Operation.switch and rules[-1] is OnFailure.fail_and_degrade, strategy


# --- success ------------------------------------------------------------------------------------------


def test_background_scale_up_prepares_syncs_pauses_and_switches_every_engine(stage: Scenario) -> None:
    job = stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    for agent in stage.serving:
        assert agent.ops(job.id) == ["prepare", "sync", "pause", "switch"]
        assert (agent.generation, agent.state) == (2, AgentState.serving)
    joiner = stage.idle[0]
    assert joiner.ops(job.id) == ["prepare", "sync", "pause", "switch"]
    assert (joiner.generation, joiner.rank) == (2, 2)
    deployment = stage.deployment()
    assert (deployment.current_dp_size, deployment.generation, deployment.status) == (3, 2, "ready")
    assert job.downtime_ms is not None and job.downtime_ms > 0
    assert job.cleanup_state == "pending"
    assert [e.to_state for e in stage.events(job.id) if e.kind == "transition"] == [
        "preparing",
        "syncing",
        "committing",
        "cleaning_up",
        "succeeded",
    ]


def test_blocking_strategy_pauses_before_it_syncs(stage: Scenario) -> None:
    job = stage.run_job(3, strategy=Strategy.blocking)
    assert job.state == JobState.succeeded, job.error
    for agent in [*stage.serving, *stage.idle]:
        assert agent.ops(job.id) == ["prepare", "pause", "sync", "switch"]
    assert stage.deployment().generation == 2


def test_a_scale_up_launches_what_is_missing(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine, idle=0)
    job = stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    assert len(stage.launcher.started) == 1
    launched = stage.agents[stage.launcher.started[0]]
    assert (launched.generation, launched.rank) == (2, 2)
    assert stage.engine_rows()[launched.engine_id].state == "serving"
    steps = [e.message for e in stage.events(job.id) if e.kind == "progress"]
    assert "launching: 1 new engine" in steps, steps  # the step names what it waits for


def test_a_scale_down_releases_the_leavers(stage: Scenario) -> None:
    job = stage.run_job(1)
    assert job.state == JobState.succeeded, job.error
    leaver = stage.serving[1]
    assert stage.launcher.released == [leaver.engine_id]
    assert leaver.rank is None and stage.engine_rows()[leaver.engine_id].state == "left"


# --- a failure before the pause: roll back ------------------------------------------------------------


def test_a_failure_before_the_pause_rolls_back_aborts_everywhere_and_releases_the_joiner(
    stage: Scenario,
) -> None:
    joiner = stage.idle[0]
    joiner.faults.add("fail_prepare")
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    assert job.error is not None
    assert (job.error["phase"], job.error["engine_id"], job.error["type"]) == (
        "preparing",
        joiner.engine_id,
        INJECTED,
    )
    for agent in [*stage.serving, joiner]:
        assert agent.ops(job.id)[-1] == "abort", agent.calls
        assert "pause" not in agent.ops(job.id)
    assert all(a.state == AgentState.serving and a.generation == 1 for a in stage.serving)
    assert stage.launcher.released == [joiner.engine_id]
    assert job.downtime_ms == 0.0
    deployment = stage.deployment()
    assert (deployment.current_dp_size, deployment.generation, deployment.status) == (2, 1, "ready")


def test_one_participant_failing_prepare_aborts_the_others_while_they_still_prepare(
    db_engine: DbEngine,
) -> None:
    """The first failure ends the phase on every participant: the coordinator does not wait for the
    others to settle (or for the prepare deadline, an hour here) before it aborts them."""
    stage = make_scenario(db_engine, settings=fast_settings(prepare_deadline_s=3600.0))
    slow, joiner = stage.serving[0], stage.idle[0]
    slow.faults.add("hang_prepare")  # still preparing until aborted
    joiner.faults.add("fail_prepare")
    phase_at_abort: dict[str, ReconfigPhase | None] = {}

    def note_phase(agent: FakeAgent) -> Callable[[str], None]:
        def before(operation: str) -> None:
            if operation == "abort":
                phase_at_abort[agent.engine_id] = agent.status.phase if agent.status else None

        return before

    slow.before = note_phase(slow)
    job_id = stage.new_job(3)

    async def go() -> None:
        await asyncio.wait_for(stage.run(job_id), 60)  # a guard against a hang only

    asyncio.run(go())
    job = stage.job(job_id)
    assert job.state == JobState.rolled_back
    assert job.error is not None and job.error["engine_id"] == joiner.engine_id
    assert phase_at_abort == {slow.engine_id: ReconfigPhase.preparing}
    assert all(agent.ops(job_id)[-1] == "abort" for agent in [*stage.serving, joiner])


def test_participants_failing_prepare_together_leave_no_failure_unread(
    stage: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    """The job names one failure; the others of the same round are read too, so none is logged later
    as "Task exception was never retrieved" by the garbage collector, at whatever code then runs (in
    CPython 3.11, an `ast.parse` it interrupted failed with a `SystemError`)."""
    for agent in [*stage.serving, stage.idle[0]]:
        agent.faults.add("fail_prepare")
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    gc.collect()  # the failed follow tasks sit in reference cycles (a traceback holds its frame)
    unread = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert unread == []


@pytest.mark.parametrize("who", ["staying", "joiner"])
def test_a_participant_that_freezes_while_prepare_waits_ends_the_step_and_the_rollback_waits_for_no_thaw(
    db_engine: DbEngine, who: str
) -> None:
    """Issue 34: a frozen engine (connected, never answering) fails prepare at the first call it leaves
    unanswered, and the rollback does not wait for it to settle: its abort is sent, no status read
    follows. The step's deadline and every agent step's own are an hour here: waiting for either (as
    the step's long-polls and the rollback's settling did) would hang the test."""
    stage = make_scenario(
        db_engine,
        settings=fast_settings(
            prepare_deadline_s=3600.0, abort_deadline_s=3600.0, transfer_s=3600.0, rendezvous_s=3600.0
        ),
    )
    frozen = stage.serving[1] if who == "staying" else stage.idle[0]
    frozen.faults.add("hang_prepare")  # held in its weight transfer, where it freezes

    def freeze_after_the_first_watch(operation: str) -> None:
        if operation == "watch":
            frozen.faults.add("silent")

    frozen.before = freeze_after_the_first_watch
    job_id = stage.new_job(3)

    async def go() -> None:
        await asyncio.wait_for(stage.run(job_id), 60)  # a guard against a hang only

    asyncio.run(go())
    job = stage.job(job_id)
    assert job.state == JobState.rolled_back
    assert job.error is not None
    assert (job.error["engine_id"], job.error["type"]) == (frozen.engine_id, "deadline-exceeded")
    after = [op for op, _ in frozen.calls[frozen.calls.index(("watch", job_id)) + 1 :]]
    assert after == ["watch", "abort"], after  # the unanswered long-poll, its abort; nothing waits on it
    others = [a for a in [*stage.serving, *stage.idle] if a is not frozen]
    assert all(a.ops(job_id)[-1] == "abort" for a in others)
    assert job.downtime_ms == 0.0


def test_an_unreachable_member_fails_the_plan_and_nothing_is_sent(stage: Scenario) -> None:
    down = stage.serving[1]
    down.faults.add("unreachable")
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    assert job.error is not None
    assert (job.error["engine_id"], job.error["type"]) == (down.engine_id, "agent-unreachable")
    assert all(agent.ops(job.id) == [] for agent in stage.agents.values())


def test_a_launcher_that_is_not_configured_is_a_clear_error(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine, idle=0)
    stage.flow.participants.launchers = {}
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    assert job.error is not None and job.error["type"] == "unknown-launcher"


# --- the pause not confirmed: resume all --------------------------------------------------------------


@pytest.mark.parametrize("fault", ["silent_pause", "fail_pause"])
def test_a_pause_not_confirmed_resumes_every_engine_on_the_old_generation(
    stage: Scenario, fault: str
) -> None:
    stuck = stage.serving[1]
    stuck.faults.add(fault)
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    assert job.error is not None
    assert (job.error["phase"], job.error["engine_id"]) == ("committing", stuck.engine_id)
    assert job.error["type"] == ("deadline-exceeded" if fault == "silent_pause" else INJECTED)
    for agent in [*stage.serving, *stage.idle]:
        assert agent.ops(job.id)[-2:] == ["pause", "abort"], agent.calls
        assert "switch" not in agent.ops(job.id)
    assert all(not a.paused and a.generation == 1 for a in stage.serving)
    assert stage.launcher.released == [stage.idle[0].engine_id]
    assert job.downtime_ms is not None and job.downtime_ms > 0  # the pause cost something
    assert "every engine resumed the old generation" in str(stage.events(job.id)[-1].message)
    assert stage.deployment().generation == 1


def test_blocking_a_failure_inside_the_pause_resumes_all(stage: Scenario) -> None:
    stage.serving[0].faults.add("fail_sync")
    job = stage.run_job(3, strategy=Strategy.blocking)
    assert job.state == JobState.rolled_back
    assert job.error is not None and job.error["phase"] == "syncing"
    assert all(a.ops(job.id)[-1] == "abort" and not a.paused for a in stage.serving)
    assert job.downtime_ms is not None and job.downtime_ms > 0


# --- the switch failing part-way: fail and degrade ----------------------------------------------------


def test_a_switch_failing_part_way_fails_the_job_degrades_the_deployment_and_shows_generations(
    stage: Scenario,
) -> None:
    failing = stage.serving[1]
    failing.faults.add("fail_switch")
    job = stage.run_job(3)
    assert job.state == JobState.failed
    assert job.error is not None
    assert (job.error["phase"], job.error["engine_id"]) == ("committing", failing.engine_id)
    assert stage.deployment().status == "degraded"
    generations = {r["engine_id"]: r["agent"]["generation"] for r in job.engine_results}
    assert generations == {
        stage.serving[0].engine_id: 2,
        failing.engine_id: 1,
        stage.idle[0].engine_id: 2,
    }
    rows = stage.engine_rows()
    assert rows[failing.engine_id].generation == 1 and rows[stage.serving[0].engine_id].generation == 2
    assert all("abort" not in a.ops(job.id) for a in stage.agents.values())  # a switch cannot be undone


def test_a_member_that_does_not_serve_the_new_generation_after_the_switch_fails_the_job(
    stage: Scenario,
) -> None:
    """`committed` is not enough: a member whose new group broke right after its switch (a peer died)
    serves nothing, so the job fails and the deployment is degraded instead of `succeeded`."""
    broken = stage.serving[1]

    def group_breaks_after(operation: str) -> None:
        if operation == "switch":
            broken.faults.add("unreachable")

    broken.before = group_breaks_after
    job = stage.run_job(3)
    assert job.state == JobState.failed
    assert job.error is not None
    assert (job.error["type"], job.error["engine_id"]) == ("member-not-serving", broken.engine_id)
    assert stage.deployment().status == "degraded"


def test_an_engine_killed_in_the_window_is_the_one_the_failed_job_names(stage: Scenario) -> None:
    """SIGKILL of a member inside the commit window: its peer's collective fails first ("connection
    closed by peer") and reaches the coordinator before the dead engine's call fails. The job names
    the engine that stopped answering, not the healthy one that reported it."""
    reporter, killed = stage.serving
    reporter.faults.add("fail_switch")  # the peer's report: its switch failed

    def dies_at(operation: str) -> None:
        if operation == "switch":
            killed.faults.add("unreachable")

    killed.before = dies_at
    job = stage.run_job(3)
    assert job.state == JobState.failed
    assert job.error is not None
    assert (job.error["type"], job.error["engine_id"]) == ("agent-unreachable", killed.engine_id)
    assert reporter.engine_id in job.error["message"]


# --- cancellation -------------------------------------------------------------------------------------


def test_a_cancel_during_engine_launch_stops_the_launch(db_engine: DbEngine) -> None:
    # The launch would take ten minutes: only the cancel can end this job.
    stage = make_scenario(db_engine, idle=0, launch_delay_s=600.0)
    job_id = stage.new_job(3)

    async def go() -> None:
        running = asyncio.create_task(stage.run(job_id))
        await asyncio.wait_for(stage.launcher.launching.wait(), 10)
        await asyncio.to_thread(stage.cancel, job_id)
        await asyncio.wait_for(running, 30)

    asyncio.run(go())
    job = stage.job(job_id)
    assert job.state == JobState.cancelled
    assert job.error is not None and job.error["type"] == "cancelled"
    assert stage.launcher.launch_cancelled and stage.launcher.started == []
    assert all(agent.ops(job_id) == [] for agent in stage.agents.values())


def test_a_cancel_during_prepare_aborts_everywhere_and_ends_cancelled(stage: Scenario) -> None:
    stage.serving[0].faults.add("hang_prepare")
    job_id = stage.new_job(3)

    async def go() -> None:
        running = asyncio.create_task(stage.run(job_id))
        while stage.serving[0].status is None:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(stage.cancel, job_id)
        await asyncio.wait_for(running, 30)

    asyncio.run(go())
    job = stage.job(job_id)
    assert job.state == JobState.cancelled
    assert job.downtime_ms == 0.0
    assert all(agent.ops(job_id)[-1] == "abort" for agent in [*stage.serving, *stage.idle])
    assert stage.deployment().generation == 1


def test_a_cancel_that_races_the_move_to_committing_is_honoured(stage: Scenario) -> None:
    """The cancel lands after the last engine synced, before the job moves to committing: the move is
    refused over the pending cancel, so the job is rolled back and cancelled, never paused."""
    job_id = stage.new_job(3)
    last = stage.idle[0]  # the last member to sync

    def cancel_at_sync(operation: str) -> None:
        if operation == "sync":
            stage.cancel(job_id)

    last.before = cancel_at_sync
    asyncio.run(stage.run(job_id))
    job = stage.job(job_id)
    assert job.state == JobState.cancelled, job.error
    assert all("pause" not in agent.ops(job_id) for agent in stage.agents.values())
    assert all(agent.ops(job_id)[-1] == "abort" for agent in [*stage.serving, last])


def test_a_cancel_requested_before_the_job_starts_cancels_it_without_touching_agents(stage: Scenario) -> None:
    job_id = stage.new_job(3)
    with Session(stage.db) as session:  # as if asked while claimed, just before it started
        row = session.get(ReconfigurationJob, job_id)
        assert row is not None
        row.cancel_requested = True
        session.add(row)
        session.commit()
    asyncio.run(stage.run(job_id))
    assert stage.job(job_id).state == JobState.cancelled
    assert all(agent.calls == [] for agent in stage.agents.values())


def test_an_unexpected_error_ends_the_job_by_its_steps_rule_as_an_internal_error(stage: Scenario) -> None:
    def explode(operation: str) -> None:
        if operation == "pause":
            raise RuntimeError("a bug")

    stage.serving[0].before = explode
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    assert job.error is not None
    assert (job.error["phase"], job.error["type"]) == ("committing", "internal-error")
    assert "RuntimeError: a bug" in job.error["message"]
    assert all(not agent.paused and agent.generation == 1 for agent in stage.serving)  # resumed all


# --- the engine-agreed commit (its failure rules are shown with real agents: tests/agent) ---------------


def test_engine_agreed_commit_arms_every_engine_and_sends_nothing_else_to_commit(stage: Scenario) -> None:
    job = stage.run_job(3, commit="engines")
    assert job.state == JobState.succeeded, job.error
    assert job.commit_mode == "engines"
    for agent in [*stage.serving, stage.idle[0]]:
        assert agent.ops(job.id) == ["prepare", "sync", "arm"]
        assert agent.generation == 2
    assert job.downtime_ms is not None and job.downtime_ms > 0
    assert job.downtime is not None and job.downtime["coordinator"]["inside_window_ms"] == 0.0


def test_the_blocking_strategy_commits_through_the_coordinator(stage: Scenario) -> None:
    job = stage.run_job(3, strategy=Strategy.blocking, commit=None)
    assert job.state == JobState.succeeded, job.error
    assert job.commit_mode == "coordinator"
    assert all(a.ops(job.id) == ["prepare", "pause", "sync", "switch"] for a in stage.serving)


# --- the downtime budget --------------------------------------------------------------------------------


def test_an_engine_over_the_budget_before_the_switch_sends_everyone_back(stage: Scenario) -> None:
    stage.serving[1].faults.add("slow_boundary")
    job = stage.run_job(3, max_downtime_ms=100)
    assert job.state == JobState.rolled_back
    assert job.error is not None
    assert job.error["type"] == "downtime-budget-exceeded"
    assert job.error["engine_id"] == stage.serving[1].engine_id
    assert "step boundary" in job.error["message"]
    overrun = job.error["overrun"]
    assert (overrun["engine_id"], overrun["part"], overrun["budget_ms"]) == (
        stage.serving[1].engine_id,
        "step boundary",
        100,
    )
    assert overrun["stopped_ms"] > 100
    assert job.downtime_ms is not None and job.downtime_ms > 0  # the stop it cost is recorded
    assert all("switch" not in a.ops(job.id) for a in stage.agents.values())
    assert all(a.generation == 1 and not a.paused for a in stage.serving)


def test_a_window_within_the_budget_switches(stage: Scenario) -> None:
    job = stage.run_job(3, max_downtime_ms=60_000)
    assert job.state == JobState.succeeded, job.error
    assert job.max_downtime_ms == 60_000
