"""What an idle engine's heartbeat says broke (`peer_check.reported_break`), one row per case."""

from __future__ import annotations

import pytest

from engine_agent.peer_check import BrokenGroup, reported_break

NAMED = BrokenGroup(4, ["engine-b"])


@pytest.mark.parametrize(
    ("taken_in", "taken_in_at", "failed", "last_step_at", "expected"),
    [
        pytest.param(None, None, None, None, (None, None), id="nothing-broke"),
        pytest.param(NAMED, 10.0, 4, 11.0, (NAMED, 10.0), id="the-break-taken-in-with-its-names"),
        pytest.param(NAMED, 10.0, None, 11.0, (NAMED, 10.0), id="taken-in-and-the-loop-reset"),
        # The loop gave generation 5 up; the agent still holds 4's account: the newer one, unnamed yet.
        pytest.param(NAMED, 10.0, 5, 12.0, (BrokenGroup(5), 12.0), id="a-newer-failure-not-taken-in-yet"),
        pytest.param(None, None, 5, 12.0, (BrokenGroup(5), 12.0), id="the-first-failure-not-taken-in-yet"),
    ],
)
def test_reported_break(
    taken_in: BrokenGroup | None,
    taken_in_at: float | None,
    failed: int | None,
    last_step_at: float | None,
    expected: tuple[BrokenGroup | None, float | None],
) -> None:
    assert reported_break(taken_in, taken_in_at, failed, last_step_at) == expected
