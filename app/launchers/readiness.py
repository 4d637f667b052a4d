"""How long a launch waits for its agent to be ready, and what a launch not ready by then is (pure).

The deadline a launch gets (`launch_budget`) is the deployment's own `launch_timeout_s` where the
operator set one (used as given: the longest any of its launches waits). Otherwise it adapts: the
coordinator's launch deadline (`EPCTL_RUNNER_LAUNCH_DEADLINE_S`, what a quiet machine needs with room
to spare) is its floor, raised to `OBSERVED_SCALE` times the slowest of the last `RECENT` launches this
coordinator saw become ready (the deployment's own, else any deployment's), up to `CEILING_FACTOR`
deadlines. An adaptive deadline also stretches with the load per CPU (up to `MAX_STRETCH` times), and
past it an agent that is still working (its process used CPU in the last `PROGRESS_WINDOW_S`) is still
starting, not failed: it is waited for up to the stretched cap. A fixed 60 s rolled back two 2 -> 4
launches at load ~37 on 2 cores whose agents were still importing (issue 34).

Whatever the deadline, a launch whose process exited fails at once, with its exit code and the last
lines of its log (the agent's fatal error). What a launch that gives up reports says which it was:
exited, still starting (the machine too loaded), or stalled (alive, no CPU: hung).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

MAX_STRETCH = 4.0  # the longest wait of an adaptive deadline, in deadlines
PROGRESS_WINDOW_S = 5.0  # an agent that used CPU within this is still working
OBSERVED_SCALE = 3.0  # an adaptive deadline: this many times the slowest recent launch
RECENT = 5  # launches an adaptive deadline looks back on
CEILING_FACTOR = 10.0  # an adaptive deadline: at most this many coordinator launch deadlines


class LaunchState(StrEnum):
    waiting = "waiting"  # not ready yet, within its wait
    exited = "exited"  # the process ended before it was ready: failed
    starting = "starting"  # past every wait, still working: the machine is too loaded
    stalled = "stalled"  # past the deadline, alive but idle: hung


@dataclass(frozen=True)
class LaunchBudget:
    """The deadline one launch gets, and where it comes from."""

    deadline_s: float
    source: str  # "deployment" (its launch_timeout_s), "observed" (recent launches), "default"
    adaptive: bool  # stretched with the load, and past it for an agent still working
    slowest_recent_s: float | None = None  # the slowest recent launch it was derived from

    def describe(self) -> str:
        if not self.adaptive:
            return f"ready within {self.deadline_s:g} s (the deployment's launch_timeout_s)"
        seen = f"; slowest recent launch {self.slowest_recent_s:.1f} s" if self.slowest_recent_s else ""
        return f"ready within {self.deadline_s:g} s (adaptive{seen}), longer on a loaded machine"


def launch_budget(
    timeout_s: float | None, own: Sequence[float], fleet: Sequence[float], default_s: float
) -> LaunchBudget:
    """The deadline of a launch for a deployment whose `launch_timeout_s` is `timeout_s` (None: adaptive),
    given the start-to-ready times (seconds, oldest first) of its own recent launches and of every
    deployment's, and the coordinator's launch deadline `default_s`."""
    if timeout_s is not None:
        return LaunchBudget(timeout_s, "deployment", adaptive=False)
    recent = list(own[-RECENT:]) or list(fleet[-RECENT:])
    if not recent:
        return LaunchBudget(default_s, "default", adaptive=True)
    slowest = max(recent)
    deadline = min(default_s * CEILING_FACTOR, max(default_s, OBSERVED_SCALE * slowest))
    return LaunchBudget(deadline, "observed", adaptive=True, slowest_recent_s=slowest)


class LaunchHistory:
    """The start-to-ready times of the launches one coordinator saw (in memory: a restart starts over,
    at the default), by deployment."""

    def __init__(self) -> None:
        self._by_deployment: dict[str, deque[float]] = {}
        self._fleet: deque[float] = deque(maxlen=RECENT)

    def record(self, deployment: str, seconds: float) -> None:
        self._by_deployment.setdefault(deployment, deque(maxlen=RECENT)).append(seconds)
        self._fleet.append(seconds)

    def budget(self, deployment: str, timeout_s: float | None, default_s: float) -> LaunchBudget:
        own = self._by_deployment.get(deployment, ())
        return launch_budget(timeout_s, list(own), list(self._fleet), default_s)


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


def judge(progress: Progress, deadline_s: float, *, adaptive: bool = True) -> LaunchState:
    """Whether to wait on for the agent, or how it failed. A set (not `adaptive`) deadline is the wait
    of a process that runs, busy or not."""
    if progress.exit_code is not None:
        return LaunchState.exited
    wait_s = stretched_wait_s(deadline_s, progress.load_per_cpu) if adaptive else deadline_s
    if progress.elapsed_s < wait_s:
        return LaunchState.waiting
    working = progress.cpu_gain_s is None or progress.cpu_gain_s > 0
    if not working:
        return LaunchState.stalled
    if adaptive and progress.elapsed_s < deadline_s * MAX_STRETCH:
        return LaunchState.waiting
    return LaunchState.starting


def waiting_note(engine_id: str, progress: Progress, deadline_s: float) -> str | None:
    """What the job's log says of a launch past its deadline that is waited for all the same (an adaptive
    deadline, an agent still working); None before its deadline."""
    if progress.exit_code is not None or progress.elapsed_s < deadline_s:
        return None
    cap = deadline_s * MAX_STRETCH
    return (
        f"agent {engine_id} still starting after {progress.elapsed_s:.0f}s: its process runs "
        f"(load {progress.load_per_cpu:.1f} per CPU); waited for up to {cap:g}s while it works"
    )


def explain(
    state: LaunchState, engine_id: str, progress: Progress, log: str | None, last_words: str | None = None
) -> tuple[str, str]:
    """(error type, message) of a launch that gave up. `last_words`: the end of the agent's log (its
    fatal error, for one that exited)."""
    where = f" (log: {log})" if log else ""
    load = f"load {progress.load_per_cpu:.1f} per CPU"
    if state is LaunchState.exited:
        said = f": {last_words}" if last_words else ""
        return (
            "launch-failed",
            f"agent {engine_id} exited with code {progress.exit_code} after {progress.elapsed_s:.1f}s, "
            f"before it was ready{said}{where}",
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
        f"works; {load}): the machine is too loaded for its launch timeout (the deployment's "
        f"launch_timeout_s, or EPCTL_RUNNER_LAUNCH_DEADLINE_S){where}",
    )


def last_words(text: str, lines: int = 3, width: int = 300) -> str | None:
    """The last non-empty lines of an agent's log, joined (what it said before it exited)."""
    kept = [line.strip()[:width] for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or None
