"""The engine-agreed commit with real agent processes: the coordinator (here the test driver) arms
every engine after sync; the engines pause, switch and resume at the first step boundary at which
every member of the old generation is armed (their per-step control all-reduce carries it), with no
call from the coordinator inside the window. Outputs stay reference-exact after every job."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine_agent.protocol import AgentState, ReconfigPhase
from tests.agent.driver import (
    SMALL,
    AgentProcess,
    Driver,
    JobFailed,
    assert_serves_reference,
    random_tokens,
)

pytestmark = pytest.mark.processes

Spawn = Callable[..., list[AgentProcess]]

ENGINES = "engines"


def test_2_to_3_switches_at_the_boundary_the_engines_agree_on(spawn_agents: Spawn) -> None:
    agents = spawn_agents(3)
    driver = Driver()
    driver.reconfigure(agents[:2])
    assert_serves_reference(agents[:2])
    outcome = driver.reconfigure(agents, commit=ENGINES)
    statuses = outcome.statuses
    assert {e: s.phase for e, s in statuses.items()} == dict.fromkeys(
        ["e0", "e1", "e2"], ReconfigPhase.committed
    )
    for engine_id in ("e0", "e1"):
        pause = statuses[engine_id].pause
        assert pause is not None and pause.pause_ms is not None and pause.resumed_at is not None
        assert pause.boundary_wait_ms == 0.0  # they served up to the agreed boundary
    # Both old members stopped at the same boundary: their windows overlap.
    p0, p1 = statuses["e0"].pause, statuses["e1"].pause
    assert p0 is not None and p1 is not None and p0.resumed_at is not None and p1.resumed_at is not None
    assert max(p0.paused_at, p1.paused_at) <= min(p0.resumed_at, p1.resumed_at)
    assert statuses["e2"].pause is None  # a joiner is never down
    assert [(i.generation, i.rank, i.world_size) for i in (a.info() for a in agents)] == [
        (2, 0, 3),
        (2, 1, 3),
        (2, 2, 3),
    ]
    assert_serves_reference(agents)


def test_3_to_2_the_leaver_goes_idle_at_the_agreed_boundary(spawn_agents: Spawn) -> None:
    agents = spawn_agents(3)
    driver = Driver()
    driver.reconfigure(agents)
    outcome = driver.reconfigure(agents[:2], commit=ENGINES)
    assert outcome.statuses["e2"].role == "leaving"
    assert outcome.statuses["e2"].phase == ReconfigPhase.committed
    assert_serves_reference(agents[:2])
    leaver = agents[2].info()
    assert leaver.state == AgentState.idle and leaver.rank is None
    assert agents[2].infer(random_tokens(SMALL, 1)).status_code == 503


def test_2_to_4_to_2_keeps_outputs_exact_under_the_deferred_policy(spawn_agents: Spawn) -> None:
    agents = spawn_agents(4)
    driver = Driver()
    driver.reconfigure(agents[:2], policy="deferred")
    outcome = driver.reconfigure(agents, commit=ENGINES, policy="deferred")
    pause = outcome.statuses["e0"].pause
    assert pause is not None and pause.warmup_ms > 0  # the warm-up ran inside the agreed window
    assert_serves_reference(agents)
    driver.reconfigure(agents[2:], commit=ENGINES, policy="deferred")  # the original two leave
    assert_serves_reference(agents[2:])
    assert [a.info().state for a in agents] == [
        AgentState.idle,
        AgentState.idle,
        AgentState.serving,
        AgentState.serving,
    ]


def test_an_engine_that_never_arms_means_nobody_pauses_and_the_old_generation_serves(
    spawn_agents: Spawn,
) -> None:
    agents = spawn_agents(3)
    driver = Driver()
    driver.reconfigure(agents[:2])
    agents[1].faults(hold_arm=True)
    with pytest.raises(JobFailed) as failed:
        driver.reconfigure(agents, commit=ENGINES, arm_deadline_s=1.0)
    statuses = failed.value.statuses
    assert {s.error.type for s in statuses.values() if s.error is not None} == {"arm-timeout"}
    assert all(s.pause is None for s in statuses.values())  # downtime 0: nobody stopped
    after = [a.status() for a in agents]
    assert [s.phase for s in after] == [ReconfigPhase.aborted] * 3
    assert all(s.pause is None for s in after)
    assert [(i.generation, i.state) for i in (a.info() for a in agents)] == [
        (1, AgentState.serving),
        (1, AgentState.serving),
        (0, AgentState.idle),
    ]
    assert_serves_reference(agents[:2])
    # And the next job goes through.
    driver.reconfigure(agents, commit=ENGINES)
    assert_serves_reference(agents)


def test_formation_from_zero_engines_needs_no_boundary(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    outcome = driver.reconfigure(agents, commit=ENGINES)
    assert {s.role for s in outcome.statuses.values()} == {"joining"}
    assert_serves_reference(agents)


def test_a_window_over_the_downtime_budget_ends_on_the_old_generation_everywhere(spawn_agents: Spawn) -> None:
    agents = spawn_agents(3)
    driver = Driver()
    driver.reconfigure(agents[:2], policy="deferred")
    with pytest.raises(JobFailed):
        # Deferred warm-up (the new group's first collective) runs inside the window: 1 ms is too short.
        driver.reconfigure(agents, commit=ENGINES, policy="deferred", max_downtime_ms=1)
    after = {a.engine_id: a.status() for a in agents}  # aborted, with the error that ended the job
    errors = [s.error for s in after.values() if s.error is not None]
    assert len(errors) == 3 and {error.type for error in errors} == {"downtime-budget-exceeded"}
    named = {engine for error in errors for engine in error.engines}
    assert named and named <= {"e0", "e1"}
    overruns = [error.overrun for error in errors if error.overrun is not None]
    assert overruns and all(o.engine_id in named and o.budget_ms == 1 and o.stopped_ms > 1 for o in overruns)
    for engine_id in ("e0", "e1"):  # they stopped, then went back: the stop is on record
        pause = after[engine_id].pause
        assert pause is not None and pause.pause_ms is not None and pause.resumed_at is not None
    assert [(i.generation, i.state) for i in (a.info() for a in agents)] == [
        (1, AgentState.serving),
        (1, AgentState.serving),
        (0, AgentState.idle),
    ]
    assert_serves_reference(agents[:2])


def test_an_engine_killed_between_arming_and_the_boundary_leaves_nobody_paused(spawn_agents: Spawn) -> None:
    agents = spawn_agents(3)
    driver = Driver()
    driver.reconfigure(agents)
    agents[2].faults(hold_arm=True)  # it accepts the arm and stalls: no boundary can come
    request = driver.prepare_request(agents[:2])
    job = {"job_id": request.job_id}
    driver.post_all(agents, "/v1/reconfig/prepare", request.model_dump(mode="json"))
    driver.wait_phase(agents, ReconfigPhase.prepared)
    driver.post_all(agents, "/v1/reconfig/sync", job)
    driver.wait_phase(agents, ReconfigPhase.synced)
    driver.post_all(agents, "/v1/reconfig/arm", {**job, "deadline_s": 30.0})
    agents[2].process.kill()
    with pytest.raises(JobFailed):
        driver.wait_phase(agents[:2], ReconfigPhase.committed)
    statuses = {a.engine_id: a.status() for a in agents[:2]}
    assert all(s.pause is None for s in statuses.values())  # nobody stopped for the commit
    assert all(a.info().state != AgentState.paused for a in agents[:2])
