"""How long a launch waits for its agent to be ready, and what a launch not ready by then is (pure).

The launch deadline (`EPCTL_RUNNER_LAUNCH_DEADLINE_S`) is what a quiet machine needs with room to spare.
On a loaded machine an agent's start (importing torch alone takes 1-2 s quiet) stretches with the load,
and a fixed deadline rolled back scale-ups whose agents were still importing (two 2 -> 4 launches at
load ~37 on 2 cores). So the wait stretches with the load per CPU (up to `MAX_STRETCH` times the
deadline), and past the deadline an agent that is still working (its process used CPU in the last
`PROGRESS_WINDOW_S`) is still starting, not failed: it is waited for up to the stretched cap. What a
launch that gives up reports says which it was: exited (with its code), still starting (the machine too
loaded), or stalled (alive, no CPU: hung).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MAX_STRETCH = 4.0  # the longest wait, in launch deadlines
PROGRESS_WINDOW_S = 5.0  # an agent that used CPU within this is still working


class LaunchState(StrEnum):
    waiting = "waiting"  # not ready yet, within its wait
    exited = "exited"  # the process ended before it was ready: failed
    starting = "starting"  # past every wait, still working: the machine is too loaded
    stalled = "stalled"  # past the deadline, alive but idle: hung


def stretched_wait_s(deadline_s: float, load_per_cpu: float) -> float:
    """The wait a launch gets on a machine this loaded (1-minute load average per CPU)."""
    return deadline_s * min(MAX_STRETCH, max(1.0, load_per_cpu))


@dataclass(frozen=True)
class Progress:
    """One look at a launching agent that has not said it is ready."""

    elapsed_s: float
    exit_code: int | None  # None: its process runs
    cpu_gain_s: float | None  # CPU it used in the last `PROGRESS_WINDOW_S` (None: unknown)
    load_per_cpu: float


def judge(progress: Progress, deadline_s: float) -> LaunchState:
    """Whether to wait on for the agent, or how it failed."""
    if progress.exit_code is not None:
        return LaunchState.exited
    if progress.elapsed_s < stretched_wait_s(deadline_s, progress.load_per_cpu):
        return LaunchState.waiting
    working = progress.cpu_gain_s is None or progress.cpu_gain_s > 0
    if not working:
        return LaunchState.stalled
    if progress.elapsed_s < deadline_s * MAX_STRETCH:
        return LaunchState.waiting
    return LaunchState.starting


def explain(state: LaunchState, engine_id: str, progress: Progress, log: str | None) -> tuple[str, str]:
    """(error type, message) of a launch that gave up."""
    where = f" (log: {log})" if log else ""
    load = f"load {progress.load_per_cpu:.1f} per CPU"
    if state is LaunchState.exited:
        return (
            "launch-failed",
            f"agent {engine_id} exited with code {progress.exit_code} before it was ready{where}",
        )
    if state is LaunchState.stalled:
        return (
            "launch-stalled",
            f"agent {engine_id} was not ready within {progress.elapsed_s:.1f}s and is not starting: its "
            f"process runs but used no CPU in the last {PROGRESS_WINDOW_S:g}s ({load}){where}",
        )
    return (
        "launch-still-starting",
        f"agent {engine_id} was still starting after {progress.elapsed_s:.1f}s (its process runs and "
        f"works; {load}): the machine is too loaded for EPCTL_RUNNER_LAUNCH_DEADLINE_S{where}",
    )
