"""The canary probe: figures from recorded canaries (pure), and the recorder against a fake canary."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.probe import CanaryRecorder, CanaryResult, CanarySample, probe_figures
from app.probe.figures import percentile


def steady(
    start: float, end: float, step: float, *, latency: float = 0.01, ok: bool = True
) -> list[CanarySample]:
    count = round((end - start) / step)
    times = [start + i * step for i in range(count)]
    return [CanarySample("a", t, t + latency, ok, 200 if ok else 503) for t in times]


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([5.0], 99) == 5.0


def test_no_failure_leaves_one_canarys_wait_as_the_outage_never_the_spacing() -> None:
    samples = steady(0.0, 10.0, 0.1)
    figures = probe_figures(samples, start=0.0, end=10.0, interval_s=0.1, deadline_s=1.0)
    # The longest stretch with no successful answer while a canary waited: its own 10 ms, not the
    # 100 ms between canaries (the probe's idle time is nobody's outage).
    assert figures.outage_ms == pytest.approx(10.0)
    assert figures.failed == 0 and figures.late == 0 and figures.open_outage_since is None
    assert figures.slowest_answer_ms == pytest.approx(10.0)
    assert figures.longest_gap_ms == pytest.approx(10.0)


def test_a_recording_with_no_canary_is_no_measurement_never_an_outage_of_0() -> None:
    from app.probe import figures_changes, outage_summary

    figures = probe_figures([], start=0.0, end=10.0, interval_s=0.1, deadline_s=1.0)
    changes = figures_changes(figures)
    assert changes["client_outage_ms"] is None and changes["probe"]["canaries_sent"] == 0
    assert outage_summary(figures) == "client outage not measured (no canary sent)"
    measured = figures_changes(
        probe_figures(steady(0.0, 1.0, 0.1), start=0.0, end=1.0, interval_s=0.1, deadline_s=1.0)
    )
    assert measured["client_outage_ms"] == pytest.approx(10.0)  # one canary's wait: measured, not 0


def test_slow_answers_that_never_fail_show_as_long_as_the_slowest_answer_in_its_phase() -> None:
    # Answers in 10 ms, except those sent in prepare (1.0-2.0 s): 450 ms, like a busy host.
    samples = steady(0.0, 1.0, 0.05) + steady(1.0, 2.0, 0.05, latency=0.45) + steady(2.0, 3.0, 0.05)
    figures = probe_figures(
        samples, start=0.0, end=3.0, interval_s=0.05, deadline_s=1.0,
        marks=[("before", 0.0), ("prepare", 1.0), ("pause", 2.0)],
    )  # fmt: skip
    assert figures.failed == 0 and figures.late == 0
    # No answer for 450 ms from the first slow canary on: the stretch is the slowest answer's, and
    # never longer while nothing fails (the two figures side by side say: slow, not refused).
    assert figures.outage_ms == pytest.approx(450.0) and figures.outage_phase == "prepare"
    assert figures.slowest_answer_ms == pytest.approx(450.0)
    assert figures.slowest_answer_phase == "prepare"
    phases = {p.name: p for p in figures.phases}
    assert phases["prepare"].slowest_answer_ms == pytest.approx(450.0)
    assert phases["before"].slowest_answer_ms == pytest.approx(10.0)
    assert phases["prepare"].longest_gap_ms > 400.0  # the raw gap is still there, named as a gap


def test_the_baseline_before_the_job_is_only_for_comparison() -> None:
    # The first canary sets up its connection (700 ms), and a 503 follows: both before the job began.
    samples = [CanarySample("a", 0.0, 0.7, True, 200), CanarySample("a", 0.75, 0.76, False, 503)]
    samples += steady(0.8, 3.0, 0.05)
    figures = probe_figures(
        samples,
        start=0.0,
        end=3.0,
        interval_s=0.05,
        deadline_s=1.0,
        marks=[("before", 0.0), ("prepare", 1.0)],
    )
    assert figures.outage_ms == pytest.approx(10.0) and figures.failed == 1  # one canary's wait in the job
    assert figures.slowest_answer_ms == pytest.approx(10.0) and figures.slowest_answer_phase == "prepare"
    before = next(p for p in figures.phases if p.name == "before")
    assert before.slowest_answer_ms == pytest.approx(700.0) and before.failed == 1


def test_a_window_of_503s_is_the_outage_with_its_phase() -> None:
    # Successes until 2.0, 503s from 2.1 to 3.4, successes again from 3.5.
    samples = steady(0.0, 2.1, 0.1) + steady(2.1, 3.5, 0.1, ok=False) + steady(3.5, 5.0, 0.1)
    figures = probe_figures(
        samples, start=0.0, end=5.0, interval_s=0.1, deadline_s=1.0, epoch_offset=1000.0,
        marks=[("before", 0.0), ("committing", 2.0), ("after", 4.0)],
    )  # fmt: skip
    # From the first refused canary (sent at 2.1, after the last success at 2.01) to the first success
    # after (3.51).
    assert figures.outage_ms == pytest.approx(1410.0, abs=1.0)
    assert figures.outage_window == pytest.approx((1002.1, 1003.51))
    assert figures.outage_phase == "committing"
    assert figures.failures == {"503": 14}
    assert figures.latency_p50_ms_outside == pytest.approx(10.0)
    phases = {p.name: p for p in figures.phases}
    assert phases["before"].failed == 0 and phases["before"].longest_gap_ms == pytest.approx(10.0)
    assert phases["committing"].failed == 14
    assert phases["committing"].longest_gap_ms == pytest.approx(1410.0, abs=1.0)
    assert phases["after"].failed == 0


def test_answers_past_their_deadline_are_counted_late_and_the_outage_does_not_depend_on_it() -> None:
    # A stall: canaries sent from 1.0 to 1.8 s are all answered at 2.0 s; the deadline is 0.5 s.
    stalled = [CanarySample("a", t, 2.0, True, 200) for t in (1.0 + i * 0.1 for i in range(9))]
    samples = steady(0.0, 1.0, 0.1) + stalled + steady(2.0, 3.0, 0.1)
    figures = probe_figures(samples, start=0.0, end=3.0, interval_s=0.1, deadline_s=0.5)
    assert figures.failed == 0 and figures.late == 5  # sent at 1.0-1.4: waited 0.6-1.0 s
    # From the first stalled canary (1.0) to the first answer (2.0), late or not.
    assert figures.outage_ms == pytest.approx(1000.0, abs=1.0)
    assert figures.slowest_answer_ms == pytest.approx(1000.0)
    patient = probe_figures(samples, start=0.0, end=3.0, interval_s=0.1, deadline_s=1.5)
    assert patient.late == 0
    assert (patient.outage_ms, patient.slowest_answer_ms) == (figures.outage_ms, figures.slowest_answer_ms)


def test_an_outage_that_lasts_to_the_end_counts_to_the_end() -> None:
    samples = steady(0.0, 1.0, 0.1) + steady(1.0, 2.0, 0.1, ok=False)
    figures = probe_figures(samples, start=0.0, end=2.0, interval_s=0.1, deadline_s=1.0)
    assert figures.outage_ms == pytest.approx(1000.0, abs=1.0)  # from the first failure (1.0) to the end
    assert figures.open_outage_since == pytest.approx(1.0)


def test_several_targets_show_each_ones_longest_outage() -> None:
    a = steady(0.0, 3.0, 0.1)
    b = [
        CanarySample("b", s.sent_at, s.done_at, not 1.0 <= s.sent_at < 2.0, None)
        for s in steady(0.0, 3.0, 0.1)
    ]
    figures = probe_figures(a + b, start=0.0, end=3.0, interval_s=0.1, deadline_s=1.0)
    # "a" answered throughout: someone was served (the outage is one canary's wait).
    assert figures.outage_ms == pytest.approx(10.0)
    assert figures.per_target_outage_ms["a"] == pytest.approx(10.0)
    assert figures.per_target_outage_ms["b"] == pytest.approx(1010.0, abs=1.0)  # from 1.0 to 2.01


class FlakyCanary:
    """Answers 200, except 503 while `down` is set; records every target it was sent to."""

    def __init__(self) -> None:
        self.down = False
        self.targets: list[str] = []

    async def send(self, target: str) -> CanaryResult:
        self.targets.append(target)
        await asyncio.sleep(0.002)
        return (
            CanaryResult(ok=False, status=503, detail="scaling")
            if self.down
            else CanaryResult(ok=True, status=200)
        )


class HangingCanary:
    async def send(self, target: str) -> CanaryResult:
        await asyncio.sleep(3600)
        return CanaryResult(ok=True)


def test_the_recorder_sends_to_every_target_and_measures_the_outage() -> None:
    asyncio.run(_recorder_with_an_outage())


async def _recorder_with_an_outage() -> None:
    canary = FlakyCanary()
    async with CanaryRecorder(canary, interval_s=0.02, timeout_s=1.0) as recorder:
        recorder.set_targets(["http://a", "http://b"])
        recorder.mark("before")
        await asyncio.sleep(0.3)
        recorder.mark("committing")
        canary.down = True
        await asyncio.sleep(0.4)
        assert recorder.live().last_ok is False
        assert recorder.live().failing_for_s is not None
        canary.down = False
        await asyncio.sleep(0.3)
        assert recorder.live().last_ok is True
    figures = recorder.figures()
    assert set(canary.targets) == {"http://a", "http://b"}
    assert figures.failed > 0 and figures.sent > figures.failed
    # The outage lasted 0.4 s; the canaries see it to within a few intervals on a loaded machine.
    assert 300.0 <= figures.outage_ms <= 2000.0
    assert figures.outage_phase == "committing"
    phases = {p.name: p for p in figures.phases}
    assert phases["before"].failed == 0
    assert phases["committing"].failed == figures.failed


def test_a_canary_without_an_answer_fails_at_its_timeout_and_sending_goes_on() -> None:
    asyncio.run(_recorder_with_a_hanging_canary())


async def _recorder_with_a_hanging_canary() -> None:
    recorder = CanaryRecorder(HangingCanary(), interval_s=0.05, timeout_s=0.2, max_in_flight=2)
    async with recorder:
        recorder.set_targets(["http://a"])
        await asyncio.sleep(0.6)
    figures = recorder.figures()
    assert figures.failed >= 1
    assert figures.failures.get("timeout", 0) >= 1
    assert figures.skipped >= 1  # at most 2 in flight: later ticks were skipped, not queued


class SlowCanary:
    """Answers 200 after `latency_s`."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    async def send(self, target: str) -> CanaryResult:
        await asyncio.sleep(self.latency_s)
        return CanaryResult(ok=True, status=200)


def test_slow_answers_that_never_fail_are_an_outage_no_longer_than_the_slowest_answer() -> None:
    asyncio.run(_recorder_with_slow_answers())


async def _recorder_with_slow_answers() -> None:
    # 4 in flight at most and 150 ms each: completions come in bunches, far apart against the interval.
    recorder = CanaryRecorder(SlowCanary(0.15), interval_s=0.01, timeout_s=2.0, deadline_s=1.0)
    async with recorder:
        recorder.set_targets(["http://a"])
        await asyncio.sleep(0.5)
    figures = recorder.figures()
    assert figures.failed == 0 and figures.sent > 0
    # With every canary answered, a stretch with no answer is part of some canary's wait.
    assert figures.slowest_answer_ms is not None and figures.slowest_answer_ms >= 150.0
    assert 0.0 < figures.outage_ms <= figures.slowest_answer_ms


def test_a_canary_still_unanswered_past_its_deadline_at_the_stop_is_an_outage() -> None:
    asyncio.run(_recorder_stopped_over_a_hanging_canary())


async def _recorder_stopped_over_a_hanging_canary() -> None:
    recorder = CanaryRecorder(HangingCanary(), interval_s=0.05, timeout_s=60.0, deadline_s=0.1)
    async with recorder:
        recorder.set_targets(["http://a"])
        await asyncio.sleep(0.3)
    figures = recorder.figures()
    assert figures.failed >= 1
    assert figures.failures.get("no answer when the probe stopped", 0) >= 1
    assert figures.outage_ms > 0.0


def test_waiting_for_an_answer_after_a_change_ends_the_outage_on_an_answer_not_on_the_stop() -> None:
    asyncio.run(_recorder_waiting_for_the_first_answer_after_an_outage())


async def _recorder_waiting_for_the_first_answer_after_an_outage() -> None:
    # A long interval: stopped right after the change, no canary would have been sent since.
    canary = FlakyCanary()
    async with CanaryRecorder(canary, interval_s=0.2, timeout_s=1.0, deadline_s=0.5) as recorder:
        recorder.set_targets(["http://a"])
        recorder.mark("before")
        await asyncio.sleep(0.3)
        recorder.mark("committing")
        canary.down = True
        await asyncio.sleep(0.5)
        canary.down = False
        back = recorder.mark("verifying")
        assert await recorder.until_answered(back, timeout_s=2.0)
    figures = recorder.figures()
    phases = {p.name: p for p in figures.phases}
    assert phases["verifying"].sent >= 1 and phases["verifying"].failed == 0
    assert figures.slowest_answer_ms is not None
    # The outage ends at the moment a canary answered (in epoch seconds), not at the recorder's stop.
    assert figures.outage_window is not None and figures.outage_ms > 0.0
    answered = [s.done_at + recorder._epoch_offset for s in recorder.samples if s.ok]
    assert min(abs(figures.outage_window[1] - t) for t in answered) < 1e-6


def test_waiting_for_an_answer_gives_up_at_its_timeout_when_the_target_stays_down() -> None:
    asyncio.run(_recorder_waiting_on_a_target_that_stays_down())


async def _recorder_waiting_on_a_target_that_stays_down() -> None:
    canary = FlakyCanary()
    canary.down = True
    async with CanaryRecorder(canary, interval_s=0.02, timeout_s=1.0) as recorder:
        recorder.set_targets(["http://a"])
        assert not await recorder.until_answered(recorder.mark("verifying"), timeout_s=0.2)


def test_a_stretch_the_recorder_itself_stalled_through_is_named_as_the_probes() -> None:
    from app.probe import outage_summary

    # Served every 50 ms; the recorder's own loop stalled from 1.02 to 2.5 s: the canary sent at 1.0 is
    # read at 2.5 (the answer came, nobody read it), and none was sent meanwhile.
    samples = steady(0.0, 1.05, 0.05) + steady(2.5, 3.0, 0.05)
    samples = [s if s.sent_at != 1.0 else CanarySample("a", 1.0, 2.5, True, 200) for s in samples]
    figures = probe_figures(
        samples, start=0.0, end=3.0, interval_s=0.05, deadline_s=1.0, stalls=[(1.02, 2.5), (2.7, 2.9)]
    )
    assert figures.outage_ms == pytest.approx(1500.0, abs=1.0)  # from 1.0 to 2.5: what the probe read
    assert figures.probe_stalled_ms == pytest.approx(1480.0, abs=1.0)  # of which its own stall
    assert figures.as_dict()["probe_stalled_ms_in_outage"] == figures.probe_stalled_ms
    assert "the probe itself stalled 1480.0 ms in it" in outage_summary(figures)
    quiet = probe_figures(samples, start=0.0, end=3.0, interval_s=0.05, deadline_s=1.0)
    assert quiet.probe_stalled_ms == 0.0 and "stalled" not in outage_summary(quiet)


class BlockingCanary:
    """Answers 200 at once, except that one send blocks the whole event loop (a coordinator doing
    synchronous work) for `block_s`."""

    def __init__(self, block_s: float) -> None:
        self.block_s = block_s
        self.sends = 0

    async def send(self, target: str) -> CanaryResult:
        self.sends += 1
        if self.sends == 5:
            time.sleep(self.block_s)  # the point: the loop is blocked
        return CanaryResult(ok=True, status=200)


def test_the_recorder_notes_its_own_stalls() -> None:
    asyncio.run(_recorder_blocked_once())


async def _recorder_blocked_once() -> None:
    recorder = CanaryRecorder(BlockingCanary(0.5), interval_s=0.01, timeout_s=2.0)
    async with recorder:
        recorder.set_targets(["http://a"])
        await asyncio.sleep(0.8)
    figures = recorder.figures()
    assert figures.failed == 0 and figures.outage_ms > 0.0
    # The loop did not run for the block: the stretch it left is named as the probe's own.
    assert 0.0 < figures.probe_stalled_ms <= figures.outage_ms
