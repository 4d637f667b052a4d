"""The job page shows the job's commit mode and its downtime budget ("none" when it has none)."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from tests.ui.conftest import SeededHistory


def test_job_page_shows_the_commit_mode_and_the_downtime_budget(page: Any, history: SeededHistory) -> None:
    with history.coordinator.client() as api:
        response = api.post(
            "/v1/reconfigurations",
            json={"deployment": "beta", "target_dp_size": 2, "commit": "coordinator", "max_downtime_ms": 250},
        )
        response.raise_for_status()
    page.goto(f"/ui/jobs/{response.json()['id']}")
    expect(page.locator("#job-commit")).to_have_text("coordinator")
    expect(page.locator("#job-budget")).to_have_text("250 ms")
    page.goto(f"/ui/jobs/{history.succeeded[0]}")
    expect(page.locator("#job-commit")).to_have_text("engines")
    expect(page.locator("#job-budget")).to_have_text("none")
