"""The job's downtime is the union of the engines' pause intervals."""

from __future__ import annotations

import pytest

from app.runner.downtime import Interval, job_downtime, union, union_ms
from engine_agent.protocol import PauseInterval


def test_overlapping_intervals_merge_into_one() -> None:
    assert union([Interval(1.0, 2.0), Interval(1.5, 3.0)]) == [Interval(1.0, 3.0)]


def test_disjoint_intervals_stay_apart_and_sorted() -> None:
    assert union([Interval(5.0, 6.0), Interval(1.0, 2.0)]) == [Interval(1.0, 2.0), Interval(5.0, 6.0)]


def test_union_ms_counts_shared_time_once() -> None:
    assert union_ms([Interval(0.0, 0.010), Interval(0.005, 0.020), Interval(1.0, 1.001)]) == pytest.approx(
        21.0
    )


def test_interval_ending_before_it_starts_is_rejected() -> None:
    with pytest.raises(ValueError):
        union([Interval(2.0, 1.0)])


def test_job_downtime_is_first_pause_to_last_resume_with_each_engines_own() -> None:
    pauses = {
        "a": PauseInterval(paused_at=100.000, resumed_at=100.012, pause_ms=12.0),
        "b": PauseInterval(paused_at=100.002, resumed_at=100.015, pause_ms=13.0),
        "c": None,
    }
    downtime = job_downtime(pauses)
    assert downtime.downtime_ms == pytest.approx(15.0)
    assert downtime.window_start == 100.000
    assert downtime.window_end == 100.015
    assert downtime.per_engine_ms == {"a": 12.0, "b": 13.0}


def test_an_engine_still_paused_counts_until_now_when_given() -> None:
    downtime = job_downtime({"a": PauseInterval(paused_at=10.0)}, now=10.5)
    assert downtime.downtime_ms == pytest.approx(500.0)


def test_no_pause_means_zero_downtime() -> None:
    downtime = job_downtime({"a": None, "b": None})
    assert downtime.downtime_ms == 0.0
    assert downtime.window_start is None
