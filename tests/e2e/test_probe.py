"""The coordinator's canary probe on real engines: every job carries what a client saw, measured from
outside, beside what the engines reported."""

from __future__ import annotations

from tests.e2e.conftest import Stack
from tests.support.waiting import wait_until


def test_the_probe_sees_a_blocking_stop_and_a_shorter_background_one(stack: Stack) -> None:
    blocking = stack.scale_to(3, strategy="blocking")
    background = stack.scale_to(2, strategy="background")
    for job in (blocking, background):
        assert job["state"] == "succeeded", job
        probe = job["probe"]
        assert probe is not None and probe["canaries_sent"] > 0 and probe["unreachable"] == {}, probe
        assert probe["targets"] == job["from_dp_size"]
        phases = probe["phases"]
        print(
            f"{job['strategy']} {job['from_dp_size']}->{job['to_dp_size']}: job downtime "
            f"{job['downtime_ms']:.1f} ms, client downtime {job['client_downtime_ms']:.1f} ms, "
            f"prepare p99 {phases['prepare']['p99_ms']} ms vs before {phases['before']['p99_ms']}"
        )
    assert blocking["client_downtime_ms"] > 0
    assert background["client_downtime_ms"] < blocking["client_downtime_ms"]


def test_metrics_count_the_canaries_and_the_client_downtime(stack: Stack) -> None:
    job = stack.scale_to(3)
    assert job["state"] == "succeeded" and job["client_downtime_ms"] is not None

    def scraped() -> str | None:
        text = stack.coordinator.api.get("/metrics").text
        histogram = 'epctl_reconfiguration_client_downtime_seconds_count{outcome="succeeded"}'
        return text if histogram in text else None

    text = wait_until(scraped, timeout_s=30, what="the client downtime histogram")
    assert 'epctl_probe_canaries_total{outcome="ok"}' in text
