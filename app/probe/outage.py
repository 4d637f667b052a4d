"""The clients' outage: one rule for every measurer (pure: no clock, no I/O).

DESIGN.md ("Downtime, defined"): `client_outage_ms` is the longest stretch with no successful answer.
Here, from a list of requests (`sent_at`, `done_at`, `ok`) of any client: the canary probe, the
benchmarks' steady clients, the end-to-end tests' client. Any success ends a stretch, a late one too
(how late it was is the slowest answer's figure, and the probe's late count: not hidden, not outage).

A stretch runs from the later of the last success and the first request that was then waiting for an
answer (sent and unanswered, or failed), to the next success. So a client's own idle time between
requests is no outage (a probe sending every 20 ms would otherwise show 20 ms on a quiet job), and with
several requests in flight the stretch ends at whichever success comes first. Past the last success, a
stretch exists only if some request was still waiting or had failed: it runs to the end of the
recording, open. A window (a job's span) clips the stretches: one begun before its start counts from
the start, one still going at its end counts to the end and is open there (the clients' outage outlives
the window).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class Request(Protocol):
    """One request as a client saw it; `done_at` None: still unanswered."""

    @property
    def sent_at(self) -> float: ...

    @property
    def done_at(self) -> float | None: ...

    @property
    def ok(self) -> bool: ...


@dataclass(frozen=True)
class Stretch:
    """A stretch with no successful answer (seconds, the clients' clock)."""

    start: float
    end: float
    open: bool = False  # no success ended it by `end`

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def ms(self) -> float:
        return round(self.seconds * 1000.0, 3)


def stretches(requests: Iterable[Request], *, until: float) -> list[Stretch]:
    """Every stretch with no successful answer, in order, none empty; one that no success ended runs
    to `until` (the end of the recording), open."""
    done = sorted(((math.inf if r.done_at is None else r.done_at), r.sent_at, r.ok) for r in requests)
    finished = [d for d, _, _ in done]
    # The earliest send among requests completed after a moment: suffix minima over `done`.
    earliest = [*list(itertools.accumulate(reversed([s for _, s, _ in done]), min))[::-1], math.inf]
    successes = sorted({d for d, _, ok in done if ok and d < math.inf})
    found: list[Stretch] = []
    for a, b in itertools.pairwise([-math.inf, *successes, math.inf]):
        waiting = earliest[bisect.bisect_right(finished, a)]  # asked, and no answer by `a`
        begin = max(a, waiting)
        if b == math.inf:
            if begin < until:
                found.append(Stretch(begin, until, open=True))
        elif begin < b:
            found.append(Stretch(begin, b))
    return found


def within(found: Sequence[Stretch], *, start: float, end: float) -> list[Stretch]:
    """The stretches clipped to [start, end]; one still going at `end` is open there."""
    clipped = [
        Stretch(max(s.start, start), min(s.end, end), s.open or s.end > end)
        for s in found
        if s.start < end and s.end > start
    ]
    return [s for s in clipped if s.end > s.start]


def longest(found: Iterable[Stretch]) -> Stretch | None:
    return max(found, key=lambda s: s.seconds, default=None)


def client_outage(requests: Iterable[Request], *, start: float, end: float) -> Stretch | None:
    """The longest stretch with no successful answer within [start, end] (None: none at all)."""
    return longest(within(stretches(requests, until=end), start=start, end=end))


def outage_covering(requests: Iterable[Request], *, start: float, end: float, until: float) -> Stretch | None:
    """The longest stretch that overlaps [start, end], whole (a client's view of one event, e.g. a
    kill or an engine's pause: the stretch it caused may begin before and end after); `until` is the
    end of the recording."""
    return longest(s for s in stretches(requests, until=until) if s.start <= end and s.end >= start)
