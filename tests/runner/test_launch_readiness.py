"""The launch readiness rule (`app.launchers.readiness`): how long a launch waits, and what one that gives
up was. A fixed 60 s deadline rolled back launches still importing on a loaded machine (issue 34)."""

from __future__ import annotations

import pytest

from app.launchers.readiness import LaunchState, Progress, explain, judge, stretched_wait_s

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


def test_each_way_a_launch_gives_up_has_its_own_type_and_says_what_the_process_did() -> None:
    log = "/data/agents/demo-1.log"
    exited = Progress(elapsed_s=5.0, exit_code=3, cpu_gain_s=0.1, load_per_cpu=0.5)
    working = Progress(elapsed_s=241.0, exit_code=None, cpu_gain_s=0.3, load_per_cpu=18.5)
    idle = Progress(elapsed_s=61.0, exit_code=None, cpu_gain_s=0.0, load_per_cpu=0.5)

    kind, message = explain(LaunchState.exited, "demo-1", exited, log)
    assert kind == "launch-failed" and "exited with code 3" in message and log in message
    kind, message = explain(LaunchState.starting, "demo-1", working, log)
    assert kind == "launch-still-starting" and "still starting" in message and "load 18.5" in message
    kind, message = explain(LaunchState.stalled, "demo-1", idle, log)
    assert kind == "launch-stalled" and "used no CPU" in message
