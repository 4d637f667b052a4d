"""The launch readiness rule (`app.launchers.readiness`): how long a launch waits (the deployment's
`launch_timeout_s`, else adaptive from what this coordinator saw), and what one that gives up was. A fixed
60 s deadline rolled back launches still importing on a loaded machine (issue 34)."""

from __future__ import annotations

import pytest

from app.launchers.readiness import (
    LaunchHistory,
    LaunchState,
    Progress,
    explain,
    judge,
    last_words,
    launch_budget,
    stretched_wait_s,
    waiting_note,
)

DEADLINE_S = 60.0


@pytest.mark.parametrize(
    ("load_per_cpu", "wait_s"),
    [(0.0, 60.0), (1.0, 60.0), (2.5, 150.0), (18.5, 240.0)],  # never below the deadline, at most 4x
)
def test_the_wait_stretches_with_the_load_per_cpu(load_per_cpu: float, wait_s: float) -> None:
    assert stretched_wait_s(DEADLINE_S, load_per_cpu) == wait_s


@pytest.mark.parametrize(
    ("elapsed_s", "exit_code", "cpu_gain_s", "load", "state"),
    [
        (5.0, 1, 0.1, 0.5, LaunchState.exited),  # ended before it was ready: failed, at once
        (59.0, None, 0.0, 0.5, LaunchState.waiting),  # within the deadline, busy or not
        (61.0, None, 0.0, 0.5, LaunchState.stalled),  # past it on a quiet machine, using no CPU: hung
        (61.0, None, 0.4, 0.5, LaunchState.waiting),  # past it, still working (importing): waited for
        (61.0, None, None, 0.5, LaunchState.waiting),  # no procfs to tell: given the benefit of doubt
        (130.0, None, 0.0, 18.5, LaunchState.waiting),  # at load 37 on 2 CPUs the wait is 4 deadlines
        (241.0, None, 0.3, 18.5, LaunchState.starting),  # past every wait, still working: too loaded
        (241.0, None, 0.0, 18.5, LaunchState.stalled),
    ],
)
def test_a_launch_past_its_deadline_is_told_apart_by_its_process(
    elapsed_s: float, exit_code: int | None, cpu_gain_s: float | None, load: float, state: LaunchState
) -> None:
    progress = Progress(elapsed_s=elapsed_s, exit_code=exit_code, cpu_gain_s=cpu_gain_s, load_per_cpu=load)
    assert judge(progress, DEADLINE_S) is state


@pytest.mark.parametrize(
    ("timeout_s", "own", "fleet", "deadline_s", "source", "adaptive"),
    [
        (90.0, [], [], 90.0, "deployment", False),  # set: as given, whatever was seen
        (20.0, [50.0], [50.0], 20.0, "deployment", False),  # set below what was seen: still as given
        (None, [], [], 60.0, "default", True),  # nothing seen yet: the coordinator's deadline
        (None, [2.0, 3.5], [2.0, 3.5], 60.0, "observed", True),  # quick launches: never below the floor
        (None, [30.0, 42.0], [42.0], 126.0, "observed", True),  # 3x the slowest recent launch
        (None, [], [10.0, 45.0], 135.0, "observed", True),  # none of its own: the fleet's
        (None, [5.0], [45.0], 60.0, "observed", True),  # its own first, not the fleet's
        (None, [400.0], [400.0], 600.0, "observed", True),  # at most 10 coordinator deadlines
        (None, [100.0, 1.0, 1.0, 1.0, 1.0, 1.0], [], 60.0, "observed", True),  # only the last 5 count
    ],
)
def test_a_launch_deadline_is_the_deployments_or_adapts_to_recent_launches(
    timeout_s: float | None,
    own: list[float],
    fleet: list[float],
    deadline_s: float,
    source: str,
    adaptive: bool,
) -> None:
    budget = launch_budget(timeout_s, own, fleet, DEADLINE_S)
    assert (budget.deadline_s, budget.source, budget.adaptive) == (deadline_s, source, adaptive)


def test_the_history_keeps_each_deployments_launches_and_the_fleets() -> None:
    history = LaunchHistory()
    assert history.budget("demo", None, DEADLINE_S).source == "default"
    history.record("other", 50.0)
    assert history.budget("demo", None, DEADLINE_S).deadline_s == 150.0  # the fleet's
    history.record("demo", 30.0)
    assert history.budget("demo", None, DEADLINE_S).deadline_s == 90.0  # its own
    assert history.budget("demo", 45.0, DEADLINE_S).deadline_s == 45.0  # set wins


@pytest.mark.parametrize(
    ("elapsed_s", "exit_code", "cpu_gain_s", "load", "state"),
    [
        (1.0, 1, None, 0.5, LaunchState.exited),  # exited: failed at once, not at the timeout
        (119.0, None, 0.0, 18.5, LaunchState.waiting),  # alive, idle or busy: given the whole timeout
        (119.0, None, 0.5, 0.5, LaunchState.waiting),
        (121.0, None, 0.5, 18.5, LaunchState.starting),  # past it: no stretch, busy or not
        (121.0, None, 0.0, 18.5, LaunchState.stalled),
    ],
)
def test_a_timeout_set_on_the_deployment_is_the_wait_of_a_live_process(
    elapsed_s: float, exit_code: int | None, cpu_gain_s: float | None, load: float, state: LaunchState
) -> None:
    progress = Progress(elapsed_s=elapsed_s, exit_code=exit_code, cpu_gain_s=cpu_gain_s, load_per_cpu=load)
    assert judge(progress, 120.0, adaptive=False) is state


def test_a_launch_waited_for_past_its_deadline_is_noted_as_still_starting() -> None:
    before = Progress(elapsed_s=59.0, exit_code=None, cpu_gain_s=0.3, load_per_cpu=18.5)
    after = Progress(elapsed_s=75.0, exit_code=None, cpu_gain_s=0.3, load_per_cpu=18.5)
    assert waiting_note("demo-1", before, DEADLINE_S) is None
    note = waiting_note("demo-1", after, DEADLINE_S)
    assert note is not None and "demo-1 still starting after 75s" in note and "up to 240s" in note


def test_each_way_a_launch_gives_up_has_its_own_type_and_says_what_the_process_did() -> None:
    log = "/data/agents/demo-1.log"
    exited = Progress(elapsed_s=5.0, exit_code=3, cpu_gain_s=0.1, load_per_cpu=0.5)
    working = Progress(elapsed_s=241.0, exit_code=None, cpu_gain_s=0.3, load_per_cpu=18.5)
    idle = Progress(elapsed_s=61.0, exit_code=None, cpu_gain_s=0.0, load_per_cpu=0.5)

    kind, message = explain(LaunchState.exited, "demo-1", exited, log, "RuntimeError: no device")
    assert kind == "launch-failed" and "exited with code 3" in message and log in message
    assert "RuntimeError: no device" in message  # its reason, from its log
    kind, message = explain(LaunchState.starting, "demo-1", working, log)
    assert kind == "launch-still-starting" and "still starting" in message and "load 18.5" in message
    kind, message = explain(LaunchState.stalled, "demo-1", idle, log)
    assert kind == "launch-stalled" and "used no CPU" in message


def test_an_agents_last_words_are_the_end_of_its_log() -> None:
    text = "INFO starting\n\nTraceback (most recent call last):\n  File x\nRuntimeError: no device\n\n"
    assert last_words(text) == "Traceback (most recent call last): | File x | RuntimeError: no device"
    assert last_words("\n \n") is None
