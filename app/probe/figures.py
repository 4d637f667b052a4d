"""From recorded canaries to a job's figures (pure: no clock, no I/O).

Two figures, because a slow answer is not an outage:

- the **outage**: for one target, a window between two answers (a success, within its deadline or
  not; or the recorder's start / stop) in which a canary failed (an HTTP error, a refused connection,
  a timeout) or went unanswered past its deadline (`deadline_s`: answered later, or never). A late
  answer counts toward the outage from its deadline, and ends it: it was sent before the outage ended
  and answered after, so the target served from that answer on (a window closed only by the next
  answer *within* its deadline ran on past what clients saw: a front door that held every canary in
  flight answers them all late at once, and the next one is sent only then). The
  deployment is out while every target is (a target that does not serve yet, or any more, counts as
  out, so joiners and leavers change nothing); `outage_ms` is the longest such stretch, with the phase
  it fell in. Its resolution is one interval.
- the **slowest answer**: the longest latency of a canary that succeeded (a paused engine stalls
  requests and fails none: its pause shows here), with the phase in which that canary was sent.

An outage still going on at the stop (no good answer after its first failure) is `open_outage_since`:
the job ended with its clients out, and an incident carries their outage on from there.

Both cover the job itself: from the end of the baseline (the first phase, `BASELINE`, canaries sent
before the job changes anything) to the stop; the baseline's own figures stay in its phase, for
comparison (a first canary that sets up its connection on a busy host is no cost of the job).

Per phase: canaries sent in it, failed, late, p50/p99 and slowest answer of those that succeeded, and
the longest gap between successful completions (raw spacing, for comparison with outside clients).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.probe.canary import CanarySample

BASELINE = "before"  # the phase both backends mark first, before the job changes anything


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


def is_good(sample: CanarySample, deadline_s: float) -> bool:
    """A success within its deadline: what ends an outage."""
    return sample.ok and sample.latency_s <= deadline_s


def _bad_moments(samples: Sequence[CanarySample], deadline_s: float) -> list[float]:
    """When each failure or missed deadline became known: a failure when it completed, a late
    answer when its deadline passed."""
    moments = []
    for s in samples:
        if not s.ok:
            moments.append(min(s.done_at, s.sent_at + deadline_s))
        elif s.latency_s > deadline_s:
            moments.append(s.sent_at + deadline_s)
    return sorted(moments)


def answer_windows(
    samples: Sequence[CanarySample], *, start: float, end: float, deadline_s: float
) -> list[Window]:
    """The windows between consecutive answers (successes, late ones too) within [start, end], each
    marked whether it shows an outage (a failure or a missed deadline inside it)."""
    if end < start:
        return []
    answered = sorted(s.done_at for s in samples if s.ok and start <= s.done_at <= end)
    bad = [t for t in _bad_moments(samples, deadline_s) if start <= t <= end]
    edges = [start, *answered, end]
    windows: list[Window] = []
    f = 0
    for a, b in itertools.pairwise(edges):
        while f < len(bad) and bad[f] <= a:
            f += 1
        windows.append(Window(a, b, f < len(bad) and bad[f] <= b))
    return windows


def longest_gap(samples: Sequence[CanarySample], *, start: float, end: float) -> float:
    """The longest stretch within [start, end] with no successful completion at all (seconds)."""
    if end < start:
        return 0.0
    done = sorted(s.done_at for s in samples if s.ok and start <= s.done_at <= end)
    return max((b - a for a, b in itertools.pairwise([start, *done, end])), default=0.0)


@dataclass(frozen=True)
class PhaseFigures:
    """Canaries sent during one phase of a job (e.g. `before`, `committing`)."""

    name: str
    start: float
    end: float
    sent: int
    failed: int
    late: int  # succeeded, but after their deadline
    p50_ms: float | None
    p99_ms: float | None
    slowest_answer_ms: float | None
    longest_gap_ms: float  # the longest window in the phase with no successful completion (raw)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "failed": self.failed,
            "late": self.late,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "slowest_answer_ms": self.slowest_answer_ms,
            "longest_gap_ms": self.longest_gap_ms,
            "duration_ms": _ms(self.end - self.start),
        }


@dataclass(frozen=True)
class ProbeFigures:
    interval_ms: float
    deadline_ms: float
    targets: int
    sent: int
    failed: int
    late: int
    skipped: int  # not sent: the target still had its maximum of canaries in flight
    outage_ms: float
    outage_window: tuple[float, float] | None  # epoch seconds
    outage_phase: str | None
    # Epoch seconds: an outage still going on when the recording stopped (no good answer since its
    # first failure), so the clients' outage outlives the job (an incident takes it from there).
    open_outage_since: float | None
    slowest_answer_ms: float | None  # None: no canary succeeded
    slowest_answer_phase: str | None
    longest_gap_ms: float  # any window without a successful completion, outage or not
    latency_p50_ms_outside: float | None  # successful canaries that do not overlap the outage window
    failures: dict[str, int] = field(default_factory=dict)  # by status or reason
    phases: list[PhaseFigures] = field(default_factory=list)
    per_target_outage_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "outage_ms": self.outage_ms,
            "outage_window": {"start": self.outage_window[0], "end": self.outage_window[1]}
            if self.outage_window
            else None,
            "outage_phase": self.outage_phase,
            "open_outage_since": self.open_outage_since,
            "slowest_answer_ms": self.slowest_answer_ms,
            "slowest_answer_phase": self.slowest_answer_phase,
            "deadline_ms": self.deadline_ms,
            "canaries_sent": self.sent,
            "canaries_failed": self.failed,
            "canaries_late": self.late,
            "canaries_skipped": self.skipped,
            "failures": self.failures,
            "latency_p50_ms_outside_outage": self.latency_p50_ms_outside,
            "longest_gap_ms": self.longest_gap_ms,
            "interval_ms": self.interval_ms,
            "targets": self.targets,
            "phases": {p.name: p.as_dict() for p in self.phases},
            **({"per_target_outage_ms": self.per_target_outage_ms} if self.targets > 1 else {}),
        }


def _failure_key(sample: CanarySample) -> str:
    if sample.status is not None:
        return str(sample.status)
    return (sample.detail or "error").split(":")[0][:40]


def _phase(
    name: str, samples: Sequence[CanarySample], start: float, end: float, deadline_s: float
) -> PhaseFigures:
    sent = [s for s in samples if start <= s.sent_at < end]
    latencies = [s.latency_s for s in sent if s.ok]
    return PhaseFigures(
        name=name,
        start=start,
        end=end,
        sent=len(sent),
        failed=sum(1 for s in sent if not s.ok),
        late=sum(1 for s in sent if s.ok and s.latency_s > deadline_s),
        p50_ms=_ms(percentile(latencies, 50)),
        p99_ms=_ms(percentile(latencies, 99)),
        slowest_answer_ms=_ms(max(latencies, default=None)),
        longest_gap_ms=_ms0(longest_gap(samples, start=start, end=end)),
    )


def _phase_spans(marks: Sequence[tuple[str, float]], end: float) -> list[tuple[str, float, float]]:
    """(name, start, end) per phase: each runs to the next mark, the last to `end`."""
    ordered = sorted(marks, key=lambda m: m[1])
    return [
        (name, at, ordered[i + 1][1] if i + 1 < len(ordered) else end) for i, (name, at) in enumerate(ordered)
    ]


def _phase_at(spans: Sequence[tuple[str, float, float]], t: float) -> str | None:
    for name, a, b in spans:
        if a <= t < b:
            return name
    return spans[-1][0] if spans and t >= spans[-1][2] else None


def _phase_of_window(spans: Sequence[tuple[str, float, float]], a: float, b: float) -> str | None:
    """The phase holding most of [a, b] (a window that spans a boundary belongs where it mostly was)."""
    overlaps = [(min(b, hi) - max(a, lo), name) for name, lo, hi in spans]
    best = max(overlaps, default=None)
    if best is None or best[0] <= 0:
        return _phase_at(spans, a)
    return best[1]


def probe_figures(
    samples: Sequence[CanarySample],
    *,
    start: float,
    end: float,
    interval_s: float,
    deadline_s: float,
    marks: Sequence[tuple[str, float]] = (),
    skipped: int = 0,
    epoch_offset: float = 0.0,
) -> ProbeFigures:
    """The figures of one recording from `start` to `end` (monotonic seconds). `marks` are phase
    starts, in order: each phase runs to the next mark (the last to `end`). `epoch_offset` turns
    monotonic times into epoch seconds for the reported window."""
    spans = _phase_spans(marks, end)
    # The job's own span: after the baseline, when there is one.
    job_start = spans[0][2] if spans and spans[0][0] == BASELINE else start
    targets = sorted({s.target for s in samples})
    per_target: dict[str, float] = {}
    out: list[tuple[float, float]] | None = None
    for target in targets:
        own = [s for s in samples if s.target == target]
        windows = answer_windows(own, start=job_start, end=end, deadline_s=deadline_s)
        outages = [(w.start, w.end) for w in windows if w.outage]
        per_target[target] = _ms0(max((b - a for a, b in outages), default=0.0))
        out = outages if out is None else _intersect(out, outages)
    worst = max(out or [], key=lambda w: w[1] - w[0], default=None)
    # Still out at the stop, after a good answer (a probe never answered saw no loss: it saw nothing).
    still_out = out[-1] if out and out[-1][1] >= end else None
    if still_out is not None and not any(
        is_good(s, deadline_s) and s.done_at <= still_out[0] for s in samples
    ):
        still_out = None
    succeeded = [s for s in samples if s.ok]
    outside = [
        s.latency_s for s in succeeded if worst is None or s.done_at <= worst[0] or s.sent_at >= worst[1]
    ]
    slowest = max((s for s in succeeded if s.sent_at >= job_start), key=lambda s: s.latency_s, default=None)
    return ProbeFigures(
        interval_ms=_ms0(interval_s),
        deadline_ms=_ms0(deadline_s),
        targets=len(targets),
        sent=len(samples),
        failed=sum(1 for s in samples if not s.ok),
        late=sum(1 for s in succeeded if s.latency_s > deadline_s),
        skipped=skipped,
        outage_ms=_ms0(worst[1] - worst[0]) if worst else 0.0,
        outage_window=(worst[0] + epoch_offset, worst[1] + epoch_offset) if worst else None,
        outage_phase=_phase_of_window(spans, *worst) if worst else None,
        open_outage_since=still_out[0] + epoch_offset if still_out else None,
        slowest_answer_ms=_ms(slowest.latency_s) if slowest else None,
        slowest_answer_phase=_phase_at(spans, slowest.sent_at) if slowest else None,
        longest_gap_ms=_ms0(longest_gap(samples, start=start, end=end)),
        latency_p50_ms_outside=_ms(percentile(outside, 50)),
        failures=dict(Counter(_failure_key(s) for s in samples if not s.ok)),
        phases=[_phase(name, samples, a, b, deadline_s) for name, a, b in spans],
        per_target_outage_ms=per_target if len(targets) > 1 else {},
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
