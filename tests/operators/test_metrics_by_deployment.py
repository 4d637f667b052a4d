"""Per-job histograms split by deployment (issue 36): downtime, phase durations, client outage and the
slowest answer carry `deployment`, so an operator computes p95 downtime per deployment with
`histogram_quantile(0.95, sum by (deployment, le) (rate(epctl_reconfiguration_downtime_seconds_bucket[1h])))`;
done here on a scrape of `/metrics`, from the finished jobs' payloads as the dispatcher sees them."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.webhooks.dispatch import observe_finished_job
from tests.operators.test_metrics_conventions import PROMTOOL, promtool_problems


def _job(deployment: str, downtime_ms: float, outage_ms: float) -> dict[str, object]:
    return {
        "deployment": deployment,
        "state": "succeeded",
        "requested_by": "api",
        "downtime_ms": downtime_ms,
        "client_outage_ms": outage_ms,
        "client_slowest_answer_ms": outage_ms,
        "created_at": "2026-12-06T10:00:00+00:00",
        "finished_at": "2026-12-06T10:00:03+00:00",
        "phases": {
            "committing": {
                "started_at": "2026-12-06T10:00:02+00:00",
                "ended_at": "2026-12-06T10:00:02.5+00:00",
            }
        },
    }


def p95_by_deployment(text: str, family: str) -> dict[str, float]:
    """`histogram_quantile(0.95, sum by (deployment, le) (...))`, Prometheus' interpolation."""
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for metric in text_string_to_metric_families(text):
        for sample in metric.samples:
            if sample.name == f"{family}_bucket":
                buckets[sample.labels["deployment"]][float(sample.labels["le"])] += sample.value
    quantiles = {}
    for deployment, counts in buckets.items():
        bounds = sorted(counts)
        total = counts[math.inf]
        rank, lower, below = 0.95 * total, 0.0, 0.0
        for bound in bounds:
            if counts[bound] >= rank:
                quantiles[deployment] = (
                    bound
                    if bound == math.inf
                    else lower + (bound - lower) * (rank - below) / (counts[bound] - below)
                )
                break
            lower, below = bound, counts[bound]
    return quantiles


def _scrape(client: TestClient) -> str:
    for _ in range(20):
        observe_finished_job(_job("split-fast", 8.0, 20.0))
        observe_finished_job(_job("split-slow", 900.0, 2000.0))
    return client.get("/metrics").text


def test_p95_downtime_splits_by_deployment(client: TestClient) -> None:
    text = _scrape(client)
    downtime = p95_by_deployment(text, "epctl_reconfiguration_downtime_seconds")
    assert downtime["split-fast"] < 0.05 < 0.5 < downtime["split-slow"]
    outage = p95_by_deployment(text, "epctl_reconfiguration_client_outage_seconds")
    assert outage["split-fast"] < outage["split-slow"]
    labels = 'deployment="split-slow",outcome="succeeded",phase="committing"'
    assert f"epctl_reconfiguration_phase_duration_seconds_count{{{labels}}}" in text


@pytest.mark.processes  # promtool
@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed: scripts/prometheus-tools installs it")
def test_the_labelled_exposition_passes_promtool(client: TestClient) -> None:
    assert promtool_problems(_scrape(client)) == ""


def test_front_door_requests_count_by_deployment_and_cause(client: TestClient) -> None:
    """A finished job's front-door accounting (issue 35) as counters: passed, failed by cause, drained."""
    job = {
        **_job("door-counted", 8.0, 0.0),
        "front_door_requests": {
            "requests": 120,
            "failed": {"5xx": 2, "connection": 1, "response": 0},
            "drained": {"e3": {"in_flight_at_drain": 3, "drained_ms": 4.0}},
            "by_sender": {
                "clients": {"requests": 100, "failed": 2},
                "canaries": {"requests": 20, "failed": 0},
            },
        },
    }
    observe_finished_job(job)
    observe_finished_job({**_job("door-counted", 8.0, 0.0), "front_door_requests": None})
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in text_string_to_metric_families(client.get("/metrics").text)
        for sample in metric.samples
        if sample.labels.get("deployment") == "door-counted" and "front_door" in sample.name
    }
    deployment = ("deployment", "door-counted")
    assert samples[("epctl_front_door_requests_total", (deployment,))] == 120
    assert samples[("epctl_front_door_requests_drained_total", (deployment,))] == 3
    for sender, n in (("clients", 100), ("canaries", 20)):
        assert samples[("epctl_front_door_requests_by_sender_total", (deployment, ("sender", sender)))] == n
    for cause, n in (("5xx", 2), ("connection", 1), ("response", 0)):
        assert samples[("epctl_front_door_requests_failed_total", (("cause", cause), deployment))] == n
