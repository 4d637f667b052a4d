"""Issue 17, finding 10, in real Chromium: the dashboard works under its Content-Security-Policy (the
browser reports no violation), and /docs renders Swagger UI from this coordinator alone."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from tests.support.processes import Coordinator as CoordinatorProcess
from tests.ui.conftest import SeededHistory


def violations_and_requests(page: Any, origin: str) -> tuple[list[str], list[str]]:
    violations: list[str] = []
    elsewhere: list[str] = []
    page.on(
        "console",
        lambda message: (
            violations.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    page.on(
        "request",
        lambda request: (
            elsewhere.append(request.url) if not request.url.startswith((origin, "data:")) else None
        ),
    )
    return violations, elsewhere


def test_the_dashboard_runs_under_its_policy(
    page: Any, coordinator: CoordinatorProcess, history: SeededHistory
) -> None:
    violations, elsewhere = violations_and_requests(page, coordinator.url)
    page.goto("/ui/")
    expect(page.locator("#jobs-body tr.clickable").first).to_be_visible()
    page.locator("#jobs-body tr.clickable").first.click()
    expect(page.locator("svg").first).to_be_visible()
    assert violations == [] and elsewhere == [], (violations, elsewhere)


def test_docs_render_from_this_coordinator_alone(browser: Any, coordinator: CoordinatorProcess) -> None:
    context = browser.new_context(base_url=coordinator.url)
    try:
        page = context.new_page()
        violations, elsewhere = violations_and_requests(page, coordinator.url)
        page.goto("/docs")
        expect(page.locator(".opblock").first).to_be_visible(timeout=20_000)
        assert page.locator(".opblock").count() >= 30  # every operation is listed
        assert violations == [] and elsewhere == [], (violations, elsewhere)
    finally:
        context.close()
