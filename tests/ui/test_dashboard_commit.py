"""The job page shows the job's commit mode and its downtime budget ("none" when it has none), and which
engine overran the budget, in which part, when one did."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from tests.support.job_driver import JobDriver, create_static_deployment
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


def test_job_page_names_the_engine_and_part_that_overran_the_budget(
    page: Any, history: SeededHistory
) -> None:
    coordinator = history.coordinator
    with coordinator.client() as api:
        create_static_deployment(api, "over", engines=2)  # its own: another test leaves beta a job
        response = api.post(
            "/v1/reconfigurations", json={"deployment": "over", "target_dp_size": 1, "max_downtime_ms": 5}
        )
        response.raise_for_status()
    job_id = response.json()["id"]
    driver = JobDriver(coordinator.database_url, job_id)
    for before, after in (("pending", "preparing"), ("preparing", "syncing"), ("syncing", "committing")):
        driver.move(before, after)
    overrun = {"engine_id": "over-e1", "part": "warm_up", "stopped_ms": 7.4, "budget_ms": 5}
    message = "engine over-e1 was stopped 7.4 ms in its warm_up (budget 5 ms); every engine resumed"
    error = {"phase": "committing", "engine_id": "over-e1", "type": "downtime-budget-exceeded"}
    driver.move("committing", "rolled_back", error={**error, "message": message, "overrun": overrun})
    driver.close()
    page.goto(f"/ui/jobs/{job_id}")
    expect(page.locator("#job-overrun")).to_have_text(
        "engine over-e1, part warm_up: stopped 7.40 ms of a 5 ms budget"
    )
