"""From recorded canaries to a job's figures (pure: no clock, no I/O).

Two figures, because a slow answer is not hidden in an outage, nor an outage in a slow answer:

- the **outage** (`client_outage_ms`): the longest stretch with no successful answer, by the one rule
  every client measurer uses (`app.probe.outage`: from the first canary left waiting after the last
  success to the next success of any target, a late one too; a canary's own wait is the shortest
  stretch a probe can see), within the job's span, with the phase it fell in. All targets together:
  the deployment is out while no target answers (a leaver's 503s while the others answer are none),
  and each target's own figure beside it. Its resolution is one interval.
- the **slowest answer**: the longest latency of a canary that succeeded, with the phase in which it
  was sent; and the **late** count: successes past `deadline_s` (a front door that held canaries
  through a commit answers them late: they are in the outage, and counted here as well).

An outage still going on at the stop (no success since it began) is `open_outage_since`: the job
ended with its clients out, and an incident carries their outage on from there.

Both cover the job itself: from the end of the baseline (the first phase, `BASELINE`, canaries sent
before the job changes anything) to the stop; the baseline's own figures stay in its phase, for
comparison (a first canary that sets up its connection on a busy host is no cost of the job).

Per phase: canaries sent in it, failed, late, p50/p99 and slowest answer of those that succeeded, and
the longest stretch with no successful answer within the phase (`longest_gap_ms`, the same rule).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.probe.canary import CanarySample
from app.probe.outage import Stretch, longest, stretches, within

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


def longest_stretch_s(found: Sequence[Stretch], *, start: float, end: float) -> float:
    """The longest stretch with no successful answer within [start, end] (seconds; 0 for none)."""
    worst = longest(within(found, start=start, end=end))
    return worst.seconds if worst else 0.0


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
    longest_gap_ms: float  # the longest stretch in the phase with no successful answer (the outage rule)

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
    # The longest time the recorder itself did not run (its event loop or process stalled) inside the
    # outage: answers that came meanwhile were read late, so that part is the observer's, not clients'.
    probe_stalled_ms: float
    outage_ms: float
    outage_window: tuple[float, float] | None  # epoch seconds
    outage_phase: str | None
    # Epoch seconds: an outage still going on when the recording stopped (no good answer since its
    # first failure), so the clients' outage outlives the job (an incident takes it from there).
    open_outage_since: float | None
    slowest_answer_ms: float | None  # None: no canary succeeded
    slowest_answer_phase: str | None
    longest_gap_ms: float  # the same rule over the whole recording, the baseline included
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
            "probe_stalled_ms_in_outage": self.probe_stalled_ms,
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
    name: str,
    samples: Sequence[CanarySample],
    found: Sequence[Stretch],
    start: float,
    end: float,
    deadline_s: float,
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
        longest_gap_ms=_ms0(longest_stretch_s(found, start=start, end=end)),
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
    stalls: Sequence[tuple[float, float]] = (),
    epoch_offset: float = 0.0,
) -> ProbeFigures:
    """The figures of one recording from `start` to `end` (monotonic seconds). `marks` are phase
    starts, in order: each phase runs to the next mark (the last to `end`). `epoch_offset` turns
    monotonic times into epoch seconds for the reported window."""
    spans = _phase_spans(marks, end)
    # The job's own span: after the baseline, when there is one.
    job_start = spans[0][2] if spans and spans[0][0] == BASELINE else start
    targets = sorted({s.target for s in samples})
    found = stretches(samples, until=end)
    per_target = {
        t: _ms0(
            longest_stretch_s(
                stretches([s for s in samples if s.target == t], until=end), start=job_start, end=end
            )
        )
        for t in targets
    }
    job = within(found, start=job_start, end=end)
    worst = longest(job)
    # Still out at the stop (a probe never answered saw no loss: it saw nothing).
    still_out = job[-1] if job and job[-1].open else None
    if still_out is not None and not any(s.ok and s.done_at <= still_out.start for s in samples):
        still_out = None
    # The recorder's own stalls inside the outage (overlap only; none outside it matter here).
    stalled = max((min(b, worst.end) - max(a, worst.start) for a, b in stalls), default=0.0) if worst else 0.0
    stalled = max(stalled, 0.0)
    succeeded = [s for s in samples if s.ok]
    outside = [
        s.latency_s for s in succeeded if worst is None or s.done_at <= worst.start or s.sent_at >= worst.end
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
        probe_stalled_ms=_ms0(stalled),
        outage_ms=worst.ms if worst else 0.0,
        outage_window=(worst.start + epoch_offset, worst.end + epoch_offset) if worst else None,
        outage_phase=_phase_of_window(spans, worst.start, worst.end) if worst else None,
        open_outage_since=still_out.start + epoch_offset if still_out else None,
        slowest_answer_ms=_ms(slowest.latency_s) if slowest else None,
        slowest_answer_phase=_phase_at(spans, slowest.sent_at) if slowest else None,
        longest_gap_ms=_ms0(longest_stretch_s(found, start=start, end=end)),
        latency_p50_ms_outside=_ms(percentile(outside, 50)),
        failures=dict(Counter(_failure_key(s) for s in samples if not s.ok)),
        phases=[_phase(name, samples, found, a, b, deadline_s) for name, a, b in spans],
        per_target_outage_ms=per_target if len(targets) > 1 else {},
    )
