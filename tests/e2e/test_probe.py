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
    # A blocking job stops serving for all of its prepare: the canaries sent then wait it out (or,
    # past their deadline, are the outage).
    seen = max(blocking["client_slowest_answer_ms"], blocking["client_outage_ms"])
    assert seen >= blocking["downtime_ms"] * 0.5, blocking["probe"]
    # A background job serves through its prepare (on 2 loaded cores a canary may still wait there for
    # the prepare's CPU: 330-500 ms seen, the same code before and after, in CI): its stop is the commit
    # window alone, so its canaries past prepare wait less than the blocking job's stopped ones.
    after_prepare = [
        figures["slowest_answer_ms"]
        for name, figures in background["probe"]["phases"].items()
        if name not in ("before", "prepare") and figures["slowest_answer_ms"] is not None
    ]
    assert after_prepare, background["probe"]["phases"]
    assert max(after_prepare) < blocking["client_slowest_answer_ms"], background["probe"]["phases"]


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
