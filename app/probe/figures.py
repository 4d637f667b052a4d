"""From recorded canaries to a job's figures (pure: no clock, no I/O).

For one target, an outage is a window between two successful completions (or from the recorder's
start / to its stop) in which a canary failed (an HTTP error, a refused connection, a timeout) or that
lasted longer than `stall_s` (requests stalled without failing). Below `stall_s`, a window with no
failure is the canaries' normal spacing, not downtime. The deployment is down while every target is
in an outage (a target that does not serve yet, or any more, counts as down, so joiners and leavers
change nothing). `client_downtime_ms` is the longest such stretch. Its resolution is one interval.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.probe.canary import CanarySample


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0-100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _ms0(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    outage: bool

    @property
    def seconds(self) -> float:
        return self.end - self.start


def success_windows(
    samples: Sequence[CanarySample], *, start: float, end: float, stall_s: float
) -> list[Window]:
    """The windows between consecutive successful completions within [start, end], each marked
    whether it shows an outage (a failure completed inside it, or it is longer than `stall_s`)."""
    if end < start:
        return []
    successes = sorted(s.done_at for s in samples if s.ok and start <= s.done_at <= end)
    failures = sorted(s.done_at for s in samples if not s.ok and start <= s.done_at <= end)
    edges = [start, *successes, end]
    windows: list[Window] = []
    f = 0
    for a, b in itertools.pairwise(edges):
        while f < len(failures) and failures[f] <= a:
            f += 1
        failed_inside = f < len(failures) and failures[f] <= b
        windows.append(Window(a, b, failed_inside or (b - a) > stall_s))
    return windows


@dataclass(frozen=True)
class PhaseFigures:
    """Canaries sent during one phase of a job (e.g. `before`, `committing`)."""

    name: str
    start: float
    end: float
    sent: int
    failed: int
    p50_ms: float | None
    p99_ms: float | None
    longest_gap_ms: float  # the longest window in the phase with no successful completion (raw)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "failed": self.failed,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "longest_gap_ms": self.longest_gap_ms,
            "duration_ms": _ms(self.end - self.start),
        }


@dataclass(frozen=True)
class ProbeFigures:
    interval_ms: float
    stall_ms: float
    targets: int
    sent: int
    failed: int
    skipped: int  # not sent: the target still had its maximum of canaries in flight
    client_downtime_ms: float
    downtime_window: tuple[float, float] | None  # epoch seconds
    longest_gap_ms: float  # any window, outage or not
    latency_p50_ms_outside: float | None  # successful canaries that do not overlap the downtime window
    failures: dict[str, int] = field(default_factory=dict)  # by status or reason
    phases: list[PhaseFigures] = field(default_factory=list)
    per_target_downtime_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "client_downtime_ms": self.client_downtime_ms,
            "downtime_window": {"start": self.downtime_window[0], "end": self.downtime_window[1]}
            if self.downtime_window
            else None,
            "canaries_sent": self.sent,
            "canaries_failed": self.failed,
            "canaries_skipped": self.skipped,
            "failures": self.failures,
            "latency_p50_ms_outside_downtime": self.latency_p50_ms_outside,
            "longest_gap_ms": self.longest_gap_ms,
            "interval_ms": self.interval_ms,
            "stall_ms": self.stall_ms,
            "targets": self.targets,
            "phases": {p.name: p.as_dict() for p in self.phases},
            **({"per_target_downtime_ms": self.per_target_downtime_ms} if self.targets > 1 else {}),
        }


def _failure_key(sample: CanarySample) -> str:
    if sample.status is not None:
        return str(sample.status)
    return (sample.detail or "error").split(":")[0][:40]


def _phase(
    name: str, samples: Sequence[CanarySample], start: float, end: float, stall_s: float
) -> PhaseFigures:
    sent = [s for s in samples if start <= s.sent_at < end]
    latencies = [s.latency_s for s in sent if s.ok]
    windows = success_windows(samples, start=start, end=end, stall_s=stall_s)
    longest = max((w.seconds for w in windows), default=0.0)
    return PhaseFigures(
        name=name,
        start=start,
        end=end,
        sent=len(sent),
        failed=sum(1 for s in sent if not s.ok),
        p50_ms=_ms(percentile(latencies, 50)),
        p99_ms=_ms(percentile(latencies, 99)),
        longest_gap_ms=_ms0(longest),
    )


def probe_figures(
    samples: Sequence[CanarySample],
    *,
    start: float,
    end: float,
    interval_s: float,
    stall_s: float,
    marks: Sequence[tuple[str, float]] = (),
    skipped: int = 0,
    epoch_offset: float = 0.0,
) -> ProbeFigures:
    """The figures of one recording from `start` to `end` (monotonic seconds). `marks` are phase
    starts, in order: each phase runs to the next mark (the last to `end`). `epoch_offset` turns
    monotonic times into epoch seconds for the reported window."""
    windows = success_windows(samples, start=start, end=end, stall_s=stall_s)
    targets = sorted({s.target for s in samples})
    per_target: dict[str, float] = {}
    down: list[tuple[float, float]] | None = None
    for target in targets:
        own = [s for s in samples if s.target == target]
        outages = [
            (w.start, w.end) for w in success_windows(own, start=start, end=end, stall_s=stall_s) if w.outage
        ]
        per_target[target] = _ms0(max((b - a for a, b in outages), default=0.0))
        down = outages if down is None else _intersect(down, outages)
    worst = max(down or [], key=lambda w: w[1] - w[0], default=None)
    outside = [
        s.latency_s
        for s in samples
        if s.ok and (worst is None or s.done_at <= worst[0] or s.sent_at >= worst[1])
    ]
    phases = []
    ordered = sorted(marks, key=lambda m: m[1])
    for i, (name, at) in enumerate(ordered):
        until = ordered[i + 1][1] if i + 1 < len(ordered) else end
        phases.append(_phase(name, samples, at, until, stall_s))
    return ProbeFigures(
        interval_ms=_ms0(interval_s),
        stall_ms=_ms0(stall_s),
        targets=len(targets),
        sent=len(samples),
        failed=sum(1 for s in samples if not s.ok),
        skipped=skipped,
        client_downtime_ms=_ms0(worst[1] - worst[0]) if worst else 0.0,
        downtime_window=(worst[0] + epoch_offset, worst[1] + epoch_offset) if worst else None,
        longest_gap_ms=_ms0(max((w.seconds for w in windows), default=0.0)),
        latency_p50_ms_outside=_ms(percentile(outside, 50)),
        failures=dict(Counter(_failure_key(s) for s in samples if not s.ok)),
        phases=phases,
        per_target_downtime_ms=per_target if len(targets) > 1 else {},
    )


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The stretches covered by both lists of disjoint, sorted intervals."""
    out: list[tuple[float, float]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out
