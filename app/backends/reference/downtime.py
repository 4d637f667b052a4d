"""A job's downtime: the union of its engines' pause intervals.

An engine is down from the moment its serving loop stops for commit until it serves again. While any
engine of an EP group is down, the whole deployment is down, so the job's downtime is the measure of
the union of the engines' intervals (with overlapping intervals, first pause to last resume).

Agents report wall-clock epoch seconds (`PauseInterval.paused_at` / `resumed_at`) so intervals from
different processes can be unioned; each engine's own duration comes from its monotonic clock
(`pause_ms`) and is kept beside the union, with the window's breakdown (`window_parts_ms`: what the
engines spent inside it, each part the longest of the serving engines': reaching the step boundary,
deferred warm-up, graph capture, blocking prepare, switch, resume).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from engine_agent.protocol import PauseInterval


@dataclass(frozen=True)
class Interval:
    start: float  # epoch seconds
    end: float  # epoch seconds, >= start

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1000.0


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The disjoint, sorted intervals covering exactly the given ones (touching intervals merge)."""
    merged: list[Interval] = []
    for current in sorted(intervals, key=lambda i: (i.start, i.end)):
        if current.end < current.start:
            raise ValueError(f"interval ends before it starts: {current}")
        if merged and current.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, current.end))
        else:
            merged.append(current)
    return merged


def union_ms(intervals: Iterable[Interval]) -> float:
    """Total milliseconds covered by at least one interval."""
    return sum(i.ms for i in union(intervals))


@dataclass(frozen=True)
class Downtime:
    """What a job records: the union in ms, its window, and each engine's own pause."""

    downtime_ms: float
    window_start: float | None  # first pause (epoch s)
    window_end: float | None  # last resume (epoch s)
    per_engine_ms: dict[str, float]
    window_parts_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "downtime_ms": round(self.downtime_ms, 3),
            "window_start": self.window_start,
            "window_end": self.window_end,
            "per_engine_ms": {k: round(v, 3) for k, v in self.per_engine_ms.items()},
            "window_parts_ms": {k: round(v, 3) for k, v in self.window_parts_ms.items()},
        }


# The parts of an engine's stopped window it reports itself (`PauseInterval`), by the name the job shows.
WINDOW_PARTS = {
    "boundary_wait": "boundary_wait_ms",
    "warm_up": "warmup_ms",
    "capture_graphs": "capture_ms",
    "blocking_prepare": "blocking_prepare_ms",
    "switch": "switch_ms",
    "resume": "resume_ms",
}


def window_parts(pauses: Iterable[PauseInterval]) -> dict[str, float]:
    """Each part of the window, the longest of the engines' (a part that no engine spent is left out)."""
    parts: dict[str, float] = {}
    for pause in pauses:
        for name, attribute in WINDOW_PARTS.items():
            value = float(getattr(pause, attribute))
            if value > 0:
                parts[name] = max(parts.get(name, 0.0), value)
    return parts


def job_downtime(
    pauses: Mapping[str, PauseInterval | None],
    *,
    now: float | None = None,
    serving: Collection[str] | None = None,
) -> Downtime:
    """The downtime of one job from each engine's reported pause.

    With `serving`, only those engines' intervals make up the union (an engine that was not serving,
    such as a joiner, stops no one); every engine's own interval is still listed.

    An engine without a pause (it never stopped) contributes nothing. A pause without a resume time
    (the engine is still down, or died paused) runs until `now` when given, else it is left out of
    the union but still counted on its own if it reported a duration.
    """
    intervals: list[Interval] = []
    per_engine: dict[str, float] = {}
    serving_pauses: list[PauseInterval] = []
    for engine_id, pause in pauses.items():
        if pause is None:
            continue
        if serving is None or engine_id in serving:
            serving_pauses.append(pause)
        end = pause.resumed_at if pause.resumed_at is not None else now
        if end is not None and (serving is None or engine_id in serving):
            intervals.append(Interval(pause.paused_at, max(end, pause.paused_at)))
        own_ms = pause.pause_ms
        if own_ms is None and end is not None:
            own_ms = (max(end, pause.paused_at) - pause.paused_at) * 1000.0
        if own_ms is not None:
            per_engine[engine_id] = own_ms
    merged = union(intervals)
    return Downtime(
        downtime_ms=sum(i.ms for i in merged),
        window_start=merged[0].start if merged else None,
        window_end=merged[-1].end if merged else None,
        per_engine_ms=per_engine,
        window_parts_ms=window_parts(serving_pauses),
    )
