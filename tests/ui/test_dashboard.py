"""The /ui dashboard as an operator uses it, in headless Chromium against a real coordinator.

Screenshots land in test-artifacts/screenshots/.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.support.job_driver import JobDriver, engine_results
from tests.support.processes import Coordinator
from tests.ui.conftest import SeededHistory, screenshot


def job_rows(page: Any) -> Any:
    return page.locator("#jobs-body tr.clickable")


def test_page_assets_need_no_token_but_the_api_does(coordinator: Coordinator) -> None:
    for path in ("/ui/", "/ui/jobs/anything", "/ui/static/app.js", "/ui/static/app.css"):
        assert httpx.get(coordinator.url + path, timeout=5).status_code == 200, path
    assert httpx.get(coordinator.url + "/ui/static/../../main.py", timeout=5).status_code == 404
    assert httpx.get(coordinator.url + "/v1/reconfigurations", timeout=5).status_code == 401


def test_dashboard_asks_for_a_token_once_and_keeps_it(
    browser: Any, coordinator: Coordinator, history: SeededHistory
) -> None:
    context = browser.new_context(base_url=coordinator.url)
    try:
        page = context.new_page()
        page.goto("/ui/")
        dialog = page.locator("#token-dialog")
        expect(dialog).to_be_visible()
        page.fill("#token-input", "wrong-token-wrong-token")
        page.click("#token-save")
        expect(page.locator("#token-error")).to_contain_text("token")  # the 401 brings the dialog back
        page.fill("#token-input", coordinator.admin_token)
        page.click("#token-save")
        expect(job_rows(page).first).to_be_visible()
        page.reload()
        expect(job_rows(page).first).to_be_visible()
        expect(dialog).to_be_hidden()
    finally:
        context.close()


def test_history_lists_every_job_with_its_state_and_a_downtime_chart(
    page: Any, history: SeededHistory
) -> None:
    page.goto("/ui/")
    expect(job_rows(page)).to_have_count(6)
    states = page.locator("#jobs-body .badge").all_inner_texts()
    assert sorted(states) == sorted(
        ["succeeded", "succeeded", "succeeded", "succeeded", "rolled back", "cancelled"]
    )
    expect(page.locator("svg.downtime-chart rect.bar[data-job]")).to_have_count(6)
    first_job_row = page.locator(f'#jobs-body tr[data-job="{history.succeeded[0]}"]')
    expect(first_job_row).to_contain_text("18.0 ms")
    expect(first_job_row).to_contain_text("cli")
    screenshot(page, "history")


def test_filters_narrow_the_history_and_live_in_the_url(page: Any, history: SeededHistory) -> None:
    page.goto("/ui/")
    expect(job_rows(page)).to_have_count(6)
    page.select_option("#f-state", "rolled_back")
    expect(page).to_have_url(re.compile(r"state=rolled_back"))
    expect(job_rows(page)).to_have_count(1)
    expect(job_rows(page).first).to_have_attribute("data-job", history.rolled_back)

    page.goto("/ui/?deployment=beta")
    expect(job_rows(page)).to_have_count(1)
    expect(page.locator("#f-deployment")).to_have_value("beta")
    page.fill("#f-after", "2000-01-01T00:00")
    page.fill("#f-before", "2000-01-02T00:00")
    page.click("#f-apply")
    expect(page).to_have_url(re.compile(r"created_after=2000-01-0"))
    expect(page.locator("#jobs-body")).to_contain_text("No reconfigurations match")
    page.goto("/ui/?state=succeeded&deployment=alpha")
    expect(job_rows(page)).to_have_count(3)
    screenshot(page, "history-filtered")


def test_pages_step_older_and_back_newer(page: Any, history: SeededHistory) -> None:
    page.goto("/ui/?deployment=alpha&limit=2")
    expect(job_rows(page)).to_have_count(2)
    first_page = [job_rows(page).nth(i).get_attribute("data-job") for i in range(2)]
    page.click("#page-older")
    expect(job_rows(page).first).not_to_have_attribute("data-job", first_page[0])
    second_page = [job_rows(page).nth(i).get_attribute("data-job") for i in range(job_rows(page).count())]
    assert not set(first_page) & set(second_page)
    page.click("#page-newer")
    expect(job_rows(page).first).to_have_attribute("data-job", first_page[0])


def test_job_page_draws_the_timeline_engines_and_transition_log(
    page: Any, history: SeededHistory, coordinator: Coordinator
) -> None:
    job_id = history.succeeded[0]
    page.goto("/ui/")
    page.locator(f'#jobs-body tr[data-job="{job_id}"] a').click()
    expect(page).to_have_url(re.compile(f"/ui/jobs/{job_id}$"))
    expect(page.locator("#job-state .badge")).to_have_text("succeeded")
    timeline = page.locator("svg.timeline")
    expect(timeline.locator("rect.bar-phase")).to_have_count(4)  # preparing, syncing, committing, cleaning up
    expect(timeline.locator("rect.bar-pause")).to_have_count(4)  # one pause per engine
    expect(timeline.locator("rect.bar-union")).to_have_count(1)
    expect(page.locator("svg.commit-window rect.bar-pause")).to_have_count(4)
    expect(page.locator("#card-downtime")).to_have_text("18.0 ms")
    expect(page.locator("#engines-table tbody tr")).to_have_count(4)
    with coordinator.client() as api:
        events = api.get(f"/v1/reconfigurations/{job_id}").json()["events"]
    expect(page.locator("#events-table tbody tr")).to_have_count(len(events))
    expect(page.locator("#events-table")).to_contain_text("old groups destroyed")
    screenshot(page, "job-succeeded")


def test_rolled_back_job_shows_the_error_with_phase_and_engine(page: Any, history: SeededHistory) -> None:
    page.goto(f"/ui/jobs/{history.rolled_back}")
    error = page.locator("#job-error")
    expect(error).to_contain_text("preparing")
    expect(error).to_contain_text("alpha-e3")
    expect(error).to_contain_text("agent alpha-e3 unreachable: connection refused")
    expect(page.locator("#card-downtime")).to_have_text("0 ms")
    expect(page.locator('.step.bad[data-step="preparing"]')).to_be_visible()
    screenshot(page, "job-rolled-back")


def test_failed_cleanup_is_shown_with_how_to_resolve_it(page: Any, history: SeededHistory) -> None:
    page.goto(f"/ui/jobs/{history.cleanup_failed}")
    cleanup = page.locator("#job-cleanup")
    expect(cleanup).to_contain_text("failed")
    expect(cleanup).to_contain_text("gloo destroy timed out")
    expect(cleanup).to_contain_text(f"epctl cleanup retry {history.cleanup_failed}")
    screenshot(page, "job-cleanup-failed")


def test_running_job_progress_advances_live(
    page: Any, history: SeededHistory, coordinator: Coordinator
) -> None:
    with coordinator.client() as api:
        response = api.post(
            "/v1/reconfigurations",
            json={"deployment": "beta", "target_dp_size": 2, "source": "api", "reason": "live"},
        )
        response.raise_for_status()
        job_id = response.json()["id"]
    driver = JobDriver(coordinator.database_url, job_id)
    page.goto(f"/ui/jobs/{job_id}")
    state = page.locator("#job-state .badge")
    percent = page.locator("#progress-percent")
    expect(state).to_have_text("pending")
    expect(page.locator("#live-mode")).to_have_text("live (event stream)")

    driver.move(
        "pending",
        "preparing",
        "claimed",
        warmup_policy="eager",
        progress_step="preparing",
        progress_percent=5.0,
    )
    expect(state).to_have_text("preparing")
    driver.progress(
        "preparing: transfer weights",
        35.0,
        engine_results=engine_results([f"beta-e{i}" for i in range(3)], from_size=3, to_size=2, generation=3),
    )
    expect(percent).to_have_attribute("data-percent", "35")
    expect(page.locator("#progress-step")).to_have_text("preparing: transfer weights")
    expect(page.locator("svg.timeline rect.bar-phase.open")).to_have_count(1)  # the running phase
    screenshot(page, "job-running")

    driver.move("preparing", "syncing", "prepared", progress_step="syncing", progress_percent=60.0)
    expect(state).to_have_text("syncing")
    expect(percent).to_have_attribute("data-percent", "60")
    driver.move("syncing", "committing", "synced", progress_step="committing", progress_percent=75.0)
    driver.move(
        "committing",
        "cleaning_up",
        "switched",
        progress_step="cleaning_up",
        progress_percent=90.0,
        downtime_ms=8.0,
        downtime={"downtime_ms": 8.0, "per_engine_ms": {}},
    )
    expect(state).to_have_text("cleaning up")
    driver.move(
        "cleaning_up",
        "succeeded",
        "done",
        progress_step="done",
        progress_percent=100.0,
        cleanup_state="succeeded",
    )
    expect(state).to_have_text("succeeded")
    expect(percent).to_have_attribute("data-percent", "100")
    expect(page.locator("#live-mode")).to_have_text("final")
    expect(page.locator("#card-downtime")).to_have_text("8.00 ms")  # one format: 2 decimals under 10 ms
    screenshot(page, "job-running-finished")


def test_cancel_button_cancels_a_pending_job(
    page: Any, history: SeededHistory, coordinator: Coordinator
) -> None:
    with coordinator.client() as api:
        response = api.post("/v1/reconfigurations", json={"deployment": "beta", "target_dp_size": 1})
        response.raise_for_status()
        job_id = response.json()["id"]
    page.goto(f"/ui/jobs/{job_id}")
    expect(page.locator("#job-state .badge")).to_have_text("pending")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-job")
    expect(page.locator("#job-state .badge")).to_have_text("cancelled")
    expect(page.locator("#cancel-job")).to_have_count(0)
    with coordinator.client() as api:
        assert api.get(f"/v1/reconfigurations/{job_id}").json()["state"] == "cancelled"


def test_unknown_job_shows_the_coordinators_problem(page: Any, history: SeededHistory) -> None:
    page.goto("/ui/jobs/rcfg_does_not_exist")
    expect(page.locator(".error-banner")).to_contain_text("rcfg_does_not_exist")
