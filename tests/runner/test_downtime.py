"""The job's downtime is the union of the engines' pause intervals."""

from __future__ import annotations

import pytest

from app.backends.reference.downtime import Interval, job_downtime, union, union_ms
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


def test_the_window_breakdown_shows_each_part_at_the_longest_serving_engines() -> None:
    pauses = {
        "a": PauseInterval(paused_at=1.0, resumed_at=1.2, warmup_ms=20.0, capture_ms=150.0, switch_ms=0.1),
        "b": PauseInterval(paused_at=1.0, resumed_at=1.3, warmup_ms=25.0, capture_ms=120.0, resume_ms=2.0),
        "joiner": PauseInterval(paused_at=1.0, resumed_at=1.5, capture_ms=400.0),
    }
    downtime = job_downtime(pauses, serving={"a", "b"})
    assert downtime.window_parts_ms == {
        "warm_up": 25.0,
        "capture_graphs": 150.0,
        "switch": 0.1,
        "resume": 2.0,
    }
    assert downtime.as_dict()["window_parts_ms"] == downtime.window_parts_ms
