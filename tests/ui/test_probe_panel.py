"""What the canary probe saw, on the dashboard: the job page's two client cards (the outage as the
headline, the slowest answer with its phase) and its probe panel; the history chart on a log scale,
where one blocking job of seconds and background jobs of milliseconds all read, blocking ones striped;
a pending cleanup in words."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect
from sqlmodel import Session

from app.jobs.transitions import append_event
from tests.support.job_driver import JobDriver, create_static_deployment, drive_to_success
from tests.support.processes import Coordinator
from tests.ui.conftest import SeededHistory, screenshot

PROBE: dict[str, Any] = {
    "outage_ms": 0.0,
    "outage_phase": None,
    "slowest_answer_ms": 453.0,
    "slowest_answer_phase": "prepare",
    "deadline_ms": 1000.0,
    "canaries_sent": 120,
    "canaries_failed": 0,
    "canaries_late": 0,
    "targets": 4,
    "interval_ms": 20.0,
    "latency_p50_ms_outside_outage": 4.2,
    "phases": {
        "before": {
            "sent": 20,
            "failed": 0,
            "late": 0,
            "p50_ms": 4.0,
            "p99_ms": 6.0,
            "slowest_answer_ms": 6.5,
            "longest_gap_ms": 21.0,
        },
        "prepare": {
            "sent": 60,
            "failed": 0,
            "late": 0,
            "p50_ms": 5.0,
            "p99_ms": 40.0,
            "slowest_answer_ms": 453.0,
            "longest_gap_ms": 470.0,
        },
    },
    "unreachable": {"alpha-e3": "ClientConnectorError: refused"},
}


def record_probe(coordinator: Coordinator, job_id: str, **changes: Any) -> None:
    with Session(JobDriver(coordinator.database_url, job_id).engine) as session:
        append_event(session, job_id=job_id, kind="probe", message="probe figures", changes=changes)


def test_a_slow_job_without_failures_shows_outage_0_and_its_slowest_answer_in_prepare(
    page: Any, history: SeededHistory
) -> None:
    job_id = history.succeeded[1]
    door = {
        "requests": 812,
        "failed": {"5xx": 0, "connection": 1, "response": 0},
        "drained": {"alpha-e3": {"in_flight_at_drain": 2, "drained_ms": 7.5}},
        "held": {"count": 5, "longest_wait_ms": 38.0, "failed": 0},
        "by_sender": {"clients": {"requests": 700, "failed": 1}, "canaries": {"requests": 112, "failed": 0}},
    }
    record_probe(
        history.coordinator,
        job_id,
        client_outage_ms=0.0,
        client_slowest_answer_ms=453.0,
        probe=PROBE,
        front_door_requests=door,
    )
    page.goto(f"/ui/jobs/{job_id}")
    expect(page).to_have_url(re.compile(f"/ui/jobs/{job_id}$"))
    expect(page.locator("#card-client-outage")).to_have_text("0 ms")
    expect(page.locator("#card-front-door")).to_have_text(
        "812 700 from clients, 112 canaries; 1 failed (connection 1); 2 drained on leavers; "
        "5 held in the window, longest 38.0 ms"
    )
    expect(page.locator("#card-slowest-answer")).to_have_text("453 ms in prepare")
    expect(page.locator("#card-client-downtime")).to_have_count(0)
    expect(page.locator("#probe-phases tbody tr")).to_have_count(2)
    expect(page.locator('#probe-phases tr[data-phase="prepare"] td.slowest')).to_have_text("453 ms")
    expect(page.locator("#probe-panel")).to_contain_text("deadline 1.00 s")
    expect(page.locator("#probe-unreachable")).to_contain_text("alpha-e3")
    screenshot(page, "job-client-outage-and-slowest-answer")
    page.goto("/ui/")
    expect(page.locator(f'svg.downtime-chart rect[data-client-job="{job_id}"]')).to_have_count(1)
    expect(page.locator(f'svg.downtime-chart rect[data-slowest-job="{job_id}"]')).to_have_count(1)


def test_a_job_whose_canaries_failed_shows_the_outage_with_its_phase(
    page: Any, history: SeededHistory
) -> None:
    job_id = history.other_deployment_job
    probe = {**PROBE, "outage_ms": 1500.0, "outage_phase": "pause", "canaries_failed": 14, "unreachable": {}}
    record_probe(
        history.coordinator, job_id, client_outage_ms=1500.0, client_slowest_answer_ms=31.0, probe=probe
    )
    page.goto(f"/ui/jobs/{job_id}")
    expect(page.locator("#card-client-outage")).to_have_text("1.50 s in pause")
    expect(page.locator("#card-slowest-answer")).to_have_text("31.0 ms in prepare")


@pytest.fixture(scope="module")
def blocking_and_background(coordinator: Coordinator) -> dict[str, str]:
    """On deployment `gamma`: one blocking job stopped 7.29 s, then background jobs of 6-41 ms."""
    jobs: dict[str, str] = {}
    engines = [f"gamma-e{i}" for i in range(3)]
    with coordinator.client() as api:
        create_static_deployment(api, "gamma", engines=3)
        for name, strategy, target, pause_ms in (
            ("blocking", "blocking", 3, 7290.0),
            ("bg-6", "background", 3, 6.0),
            ("bg-12", "background", 3, 12.0),
            ("bg-41", "background", 3, 41.0),
        ):
            jobs[name] = _scale(api, "gamma", target, strategy)
            drive_to_success(JobDriver(coordinator.database_url, jobs[name]), engines, pause_ms=pause_ms)
    return jobs


def _scale(api: httpx.Client, deployment: str, target: int, strategy: str) -> str:
    body = {"deployment": deployment, "target_dp_size": target, "strategy": strategy, "reason": "ui test"}
    response = api.post("/v1/reconfigurations", json=body)
    response.raise_for_status()
    return str(response.json()["id"])


def bar_height(page: Any, job_id: str) -> float:
    return float(page.locator(f'svg.downtime-chart rect.bar[data-job="{job_id}"]').get_attribute("height"))


def test_the_history_chart_is_on_a_log_scale_where_milliseconds_and_seconds_both_read(
    page: Any, blocking_and_background: dict[str, str]
) -> None:
    page.goto("/ui/?deployment=gamma")
    chart = page.locator("svg.downtime-chart")
    expect(chart.locator("rect.bar[data-job]")).to_have_count(4)
    expect(chart).to_have_attribute("data-scale", "log")
    ticks = chart.locator("text.tick").all_text_contents()  # (SVG text has no innerText)
    assert {"1 ms", "10 ms", "100 ms", "1 s", "10 s"} <= set(ticks), ticks
    blocking = bar_height(page, blocking_and_background["blocking"])
    shortest = bar_height(page, blocking_and_background["bg-6"])
    # On a linear axis the 6 ms bar would be 1/1200 of the 7.29 s one (drawn as a 1.5 px stub).
    assert shortest >= 0.15 * blocking, (shortest, blocking)
    assert bar_height(page, blocking_and_background["bg-12"]) > shortest
    expect(chart.locator('rect.bar[data-strategy="blocking"]')).to_have_count(1)
    expect(chart.locator("rect.stripes")).to_have_count(1)
    expect(page.locator(".legend")).to_contain_text("log scale")
    screenshot(page, "history-log-scale")


def test_a_pending_cleanup_reads_as_words_not_raw_json(page: Any, history: SeededHistory) -> None:
    job_id = history.succeeded[0]
    record_probe(
        history.coordinator,
        job_id,
        cleanup_state="pending",
        cleanup={"retired_generation": 1, "engines": ["alpha-e0", "alpha-e1"]},
    )
    page.goto(f"/ui/jobs/{job_id}")
    expect(page.locator("#job-cleanup-line")).to_have_text(
        "destroying generation 1 on 2 engines in the background"
    )
    expect(page.locator("#job-cleanup")).not_to_contain_text("retired_generation", use_inner_text=True)
