"""The one rule for the clients' outage (`app.probe.outage`), as a table: the longest stretch with no
successful answer (DESIGN.md, "Downtime, defined"), from the requests of any client (the canary probe,
the benchmarks' and the end-to-end tests' steady clients)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.probe.outage import Stretch, client_outage, outage_covering
from tests.support.stack import outage_covering_ms


@dataclass(frozen=True)
class R:
    sent_at: float
    done_at: float | None
    ok: bool = True


FAST = {"step": 0.05, "latency": 0.002}


def serial(start: float, end: float, *, step: float = 0.1, latency: float = 0.01, ok: bool = True) -> list[R]:
    """One request every `step`, each answered after `latency`."""
    return [R(start + i * step, start + i * step + latency, ok) for i in range(round((end - start) / step))]


WINDOW = (0.0, 4.0)

# (name, requests, window, expected longest stretch as (start, end, open) or None)
CASES: list[tuple[str, list[R], tuple[float, float], tuple[float, float, bool] | None]] = [
    ("no request: nothing measured", [], WINDOW, None),
    # Idle time between requests is no outage: the longest is one answer's wait.
    (
        "quiet serial client: the slowest single wait",
        [*serial(0.0, 2.0), R(2.0, 2.03), *serial(2.1, 4.0)],
        WINDOW,
        (2.0, 2.03, False),
    ),
    (
        "503s between successes: from the first refused request to the next success",
        serial(0.0, 1.0) + serial(1.0, 2.0, ok=False) + serial(2.0, 4.0),
        WINDOW,
        (1.0, 2.01, False),
    ),
    (
        "requests held by a pause, answered late together: an outage, whatever the deadline",
        [*serial(0.0, 1.0), R(1.0, 2.4), R(1.1, 2.4), R(1.2, 2.4), *serial(2.4, 4.0)],
        WINDOW,
        (1.0, 2.4, False),
    ),
    (
        "concurrency: a request hangs while others succeed: each success ends a stretch",
        [
            R(0.5, 3.0),
            *serial(0.0, 1.0, step=0.05, latency=0.002),
            *serial(1.1, 4.0, step=0.05, latency=0.002),
        ],
        WINDOW,
        (0.952, 1.102, False),  # from the last success, since the hanging one was waiting
    ),
    (
        "concurrency: two streams, one fails while the other is answered: no outage beyond a wait",
        serial(0.0, 4.0, latency=0.02) + serial(1.005, 2.005, latency=0.001, ok=False) + [R(3.95, 3.98)],
        WINDOW,
        (3.95, 3.98, False),
    ),
    (
        "a failed request before the window, the next success inside: counted from the window's start",
        [R(-1.0, -0.9, ok=False), R(0.5, 0.51), *serial(1.0, 4.0)],
        WINDOW,
        (0.0, 0.51, False),
    ),
    (
        "failing to the window's end: counted to the end, open",
        serial(0.0, 3.0) + serial(3.0, 5.0, ok=False),
        WINDOW,
        (3.0, 4.0, True),
    ),
    (
        "a request still unanswered at the end: from its send to the end, open",
        [*serial(0.0, 3.0), R(3.5, None)],
        WINDOW,
        (3.5, 4.0, True),
    ),
    (
        "answered after the window's end: open at the end",
        [*serial(0.0, 3.0), R(3.5, 4.5)],
        WINDOW,
        (3.5, 4.0, True),
    ),
    (
        "the client stopped sending: its silence after the last answer is no outage",
        [*serial(0.0, 2.0, latency=0.001), R(2.0, 2.005)],
        WINDOW,
        (2.0, 2.005, False),
    ),
    ("never answered at all: the whole time it asked", serial(0.0, 4.0, ok=False), WINDOW, (0.0, 4.0, True)),
]


@pytest.mark.parametrize(
    ("requests", "window", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_clients_outage_is_the_longest_stretch_with_no_successful_answer(
    requests: list[R], window: tuple[float, float], expected: tuple[float, float, bool] | None
) -> None:
    found = client_outage(requests, start=window[0], end=window[1])
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert (found.start, found.end, found.open) == (
            pytest.approx(expected[0]),
            pytest.approx(expected[1]),
            expected[2],
        )


def test_the_stretch_around_an_event_is_whole() -> None:
    # Served to 1.0, refused from 1.0 to 2.0 (an engine killed at 1.5), served again from 2.0.
    requests = serial(0.0, 1.0) + serial(1.0, 2.0, ok=False) + serial(2.0, 4.0)
    found = outage_covering(requests, start=1.5, end=1.6, until=4.0)
    assert found is not None and (found.start, found.end, found.open) == (
        pytest.approx(1.0),
        pytest.approx(2.01),
        False,
    )
    assert client_outage(requests, start=1.5, end=1.6) == Stretch(1.5, 1.6, True)


@pytest.mark.parametrize(
    ("requests", "expected_ms"),
    [
        ([], 0.0),
        (serial(0.0, 1.0) + serial(1.0, 2.0, ok=False) + serial(2.0, 4.0), 1010.0),  # whole, as above
        (serial(0.0, 1.0) + serial(1.0, 2.0, ok=False), 910.0),  # unended: to the last answer, 1.91
    ],
    ids=["no request", "ended by a success", "the recording ends first"],
)
def test_a_recorded_event_is_measured_to_the_recordings_last_answer(
    requests: list[R], expected_ms: float
) -> None:
    """How the end-to-end tests' and the benchmarks' steady clients measure one event (a kill at 1.5)."""
    assert outage_covering_ms(requests, 1.5, 1.6) == pytest.approx(expected_ms)
