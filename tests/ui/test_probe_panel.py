"""The job page shows what the coordinator's canary probe saw, and the history chart puts the client
downtime beside the engines' downtime."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import expect
from sqlmodel import Session

from app.jobs.transitions import append_event
from tests.cli.support import JobDriver
from tests.ui.conftest import SeededHistory

PROBE = {
    "client_downtime_ms": 31.5,
    "canaries_sent": 120,
    "canaries_failed": 0,
    "targets": 4,
    "interval_ms": 20.0,
    "latency_p50_ms_outside_downtime": 4.2,
    "phases": {
        "before": {"sent": 20, "failed": 0, "p50_ms": 4.0, "p99_ms": 6.0, "longest_gap_ms": 21.0},
        "prepare": {"sent": 60, "failed": 0, "p50_ms": 5.0, "p99_ms": 40.0, "longest_gap_ms": 55.0},
    },
    "unreachable": {"alpha-e3": "ClientConnectorError: refused"},
}


def test_job_page_shows_the_canary_probe_and_the_chart_the_client_downtime(
    page: Any, history: SeededHistory
) -> None:
    job_id = history.succeeded[1]
    with Session(JobDriver(history.coordinator.database_url, job_id).engine) as session:
        append_event(
            session,
            job_id=job_id,
            kind="probe",
            message="client downtime 31.5 ms",
            changes={"client_downtime_ms": 31.5, "probe": PROBE},
        )
    page.goto("/ui/")
    expect(page.locator(f'svg.downtime-chart rect[data-client-job="{job_id}"]')).to_have_count(1)
    page.goto(f"/ui/jobs/{job_id}")
    expect(page).to_have_url(re.compile(f"/ui/jobs/{job_id}$"))
    expect(page.locator("#card-client-downtime")).to_have_text("31.5 ms")
    expect(page.locator("#probe-phases tbody tr")).to_have_count(2)
    expect(page.locator('#probe-phases tr[data-phase="prepare"]')).to_contain_text("55.0 ms")
    expect(page.locator("#probe-unreachable")).to_contain_text("alpha-e3")
