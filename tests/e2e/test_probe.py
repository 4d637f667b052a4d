"""The coordinator's canary probe on real engines: every job carries what a client saw, measured from
outside, beside what the engines reported: a pause stalls requests without failing them, so it shows
as the slowest answer, in a phase where the engines stopped, not as an outage."""

from __future__ import annotations

from tests.support.e2e import Stack
from tests.support.waiting import wait_until


def test_the_probe_sees_a_blocking_stop_and_a_shorter_background_one(stack: Stack) -> None:
    blocking = stack.scale_to(3, strategy="blocking")
    background = stack.scale_to(2, strategy="background")
    for job in (blocking, background):
        assert job["state"] == "succeeded", job
        probe = job["probe"]
        assert probe is not None and probe["canaries_sent"] > 0 and probe["unreachable"] == {}, probe
        assert probe["targets"] == job["from_dp_size"]
        assert job["client_outage_ms"] is not None and job["client_slowest_answer_ms"] is not None
        phases = probe["phases"]
        print(
            f"{job['strategy']} {job['from_dp_size']}->{job['to_dp_size']}: job downtime "
            f"{job['downtime_ms']:.1f} ms, client outage {job['client_outage_ms']:.1f} ms, slowest answer "
            f"{job['client_slowest_answer_ms']:.1f} ms ({probe['slowest_answer_phase']}), "
            f"prepare p99 {phases['prepare']['p99_ms']} ms vs before {phases['before']['p99_ms']}"
        )
        for name, figures in phases.items():
            print(f"    {name}: {figures}")
    # The engines' record: a blocking job builds the new generation inside its stopped window, a
    # background one before it, so only the switch stops it.
    assert background["downtime_ms"] < blocking["downtime_ms"], (
        background["downtime_ms"],
        blocking["downtime_ms"],
    )
    # The probe sees the blocking stop: the canaries sent in it wait it out (or, past their deadline, are
    # the outage).
    seen = max(blocking["client_slowest_answer_ms"], blocking["client_outage_ms"])
    assert seen >= blocking["downtime_ms"] * 0.5, blocking["probe"]
    # And it sees the background job serve through its prepare: canaries sent there were answered inside
    # it. Not how fast: on 2 loaded cores opening the NIXL channel stalls every engine of the EP group for
    # 0.4-0.9 s there (as long as the blocking job's stop; seen in CI and here, see issue 39's note), and
    # the record carries that stall as the job's client outage instead of the engines' few ms.
    prepare = background["probe"]["phases"]["prepare"]
    assert prepare["sent"] > 0 and prepare["failed"] == 0, prepare
    assert prepare["longest_gap_ms"] < prepare["duration_ms"], prepare
    assert background["client_outage_ms"] >= prepare["longest_gap_ms"], (
        background["client_outage_ms"],
        prepare,
    )


def test_metrics_count_the_canaries_the_client_outage_and_the_slowest_answer(stack: Stack) -> None:
    job = stack.scale_to(3)
    assert job["state"] == "succeeded" and job["client_outage_ms"] is not None

    labels = f'{{deployment="{job["deployment"]}",outcome="succeeded"}}'

    def scraped() -> str | None:
        text = stack.coordinator.api.get("/metrics").text
        histogram = f"epctl_reconfiguration_client_outage_seconds_count{labels}"
        return text if histogram in text else None

    text = wait_until(scraped, timeout_s=30, what="the client outage histogram")
    assert f"epctl_reconfiguration_client_slowest_answer_seconds_count{labels}" in text
    assert 'epctl_probe_canaries_total{outcome="ok"}' in text
