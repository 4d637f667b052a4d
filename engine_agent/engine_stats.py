"""What the reference engine counts (steps, requests, tokens, pauses, its last group error) and the
summary of its recent real steps' durations."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

STEP_TIMES_KEPT = 1024  # the recent real steps whose durations `step_ms_summary` summarises


@dataclass
class EngineCounters:
    steps: int = 0
    graph_steps: int = 0  # steps that replayed the generation's step graphs
    dummy_steps: int = 0
    requests_served: int = 0
    tokens_served: int = 0
    pauses: int = 0
    last_error: str | None = None
    # The generation whose failure `last_error` is, set with it under the loop's lock: a heartbeat sent
    # before the agent has taken the break in (`Agent._on_broken`) still names it.
    failed_generation: int | None = None
    # When the serving generation last stepped (epoch seconds): every member steps together, so its
    # clients were served until then. Kept when the group breaks: the survivors' record of the loss.
    last_step_at: float | None = None


def step_ms_summary(step_ms: Iterable[float]) -> dict[str, float] | None:
    """p50/p99 of the step durations (ms) and how many there were; None before any."""
    times = sorted(step_ms)
    if not times:
        return None

    def pick(p: float) -> float:
        return round(times[min(len(times) - 1, int(p * len(times)))], 3)

    return {"p50": pick(0.5), "p99": pick(0.99), "steps": float(len(times))}
