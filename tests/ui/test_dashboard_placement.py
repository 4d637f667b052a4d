"""The job page shows what the new expert placement moved and the old -> new rank map."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect
from sqlmodel import Session

from app.jobs.transitions import append_event
from tests.support.job_driver import JobDriver
from tests.ui.conftest import SeededHistory


def test_job_page_shows_copies_bytes_and_the_rank_map(page: Any, history: SeededHistory) -> None:
    job_id = history.succeeded[1]
    driver = JobDriver(history.coordinator.database_url, job_id)
    with Session(driver.engine) as session:
        append_event(
            session,
            job_id=job_id,
            kind="plan",
            message="placement",
            changes={
                "placement": {
                    "rank_map": {"alpha-e0": {"old": 0, "new": 0}, "alpha-e1": {"old": 1, "new": None}},
                    "copies_moved": 12,
                    "bytes_moved": 12 * (1 << 20),
                    "lower_bound": 9,
                    "layers": 2,
                }
            },
        )
    page.goto(f"/ui/jobs/{job_id}")
    expect(page.locator("#job-copies")).to_contain_text("12 expert copies (12.0 MiB) · lower bound 9")
    expect(page.locator("#job-rank-map")).to_contain_text("alpha-e1 1 → \u2013")
    expect(page.locator("#job-rank-map")).to_contain_text("alpha-e0 0 → 0")
