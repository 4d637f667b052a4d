"""The dashboard in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright; Playwright
never downloads a browser here) against a real coordinator process on a SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.job_driver import (
    JobDriver,
    create_static_deployment,
    drive_to_rollback,
    drive_to_success,
    run_coordinator,
)
from tests.support.processes import ROOT, Coordinator

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/ui/" in str(item.fspath):
            item.add_marker(pytest.mark.browser)
            if not CHROMIUM.exists():
                reason = f"{CHROMIUM} is absent (apt-get install -y chromium)"
                item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class SeededHistory:
    """Jobs made through the API and moved through the state machine, so every state shows."""

    coordinator: Coordinator
    succeeded: list[str] = field(default_factory=list)
    rolled_back: str = ""
    cancelled: str = ""
    cleanup_failed: str = ""
    other_deployment_job: str = ""


def _scale(api: httpx.Client, deployment: str, target: int) -> str:
    response = api.post(
        "/v1/reconfigurations",
        json={"deployment": deployment, "target_dp_size": target, "source": "cli", "reason": "ui test"},
    )
    response.raise_for_status()
    return str(response.json()["id"])


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    with run_coordinator(tmp_path_factory.mktemp("ui-coordinator"), EPCTL_RUNNER_ENABLED="false") as process:
        yield process


@pytest.fixture(scope="module")
def history(coordinator: Coordinator) -> SeededHistory:
    seeded = SeededHistory(coordinator)
    with coordinator.client() as api:
        create_static_deployment(api, "alpha", engines=4)
        create_static_deployment(api, "beta", engines=3)
        alpha = [f"alpha-e{i}" for i in range(4)]
        for target, pause_ms in ((4, 18.0), (3, 11.5)):
            job_id = _scale(api, "alpha", target)
            drive_to_success(JobDriver(coordinator.database_url, job_id), alpha, pause_ms=pause_ms)
            seeded.succeeded.append(job_id)
        seeded.rolled_back = _scale(api, "alpha", 4)
        drive_to_rollback(
            JobDriver(coordinator.database_url, seeded.rolled_back),
            engine_id="alpha-e3",
            message="agent alpha-e3 unreachable: connection refused",
        )
        seeded.cancelled = _scale(api, "alpha", 2)
        JobDriver(coordinator.database_url, seeded.cancelled).move("pending", "cancelled", "operator cancel")
        seeded.cleanup_failed = _scale(api, "alpha", 2)
        driver = JobDriver(coordinator.database_url, seeded.cleanup_failed)
        drive_to_success(driver, alpha, pause_ms=9.0)
        _fail_cleanup(driver, engine_id="alpha-e1")
        seeded.other_deployment_job = _scale(api, "beta", 3)
        drive_to_success(
            JobDriver(coordinator.database_url, seeded.other_deployment_job),
            [f"beta-e{i}" for i in range(3)],
            pause_ms=7.0,
        )
    return seeded


def _fail_cleanup(driver: JobDriver, *, engine_id: str) -> None:
    from sqlmodel import Session

    from app.jobs.transitions import append_event

    with Session(driver.engine) as session:
        append_event(
            session,
            job_id=driver.job_id,
            kind="cleanup",
            message="destroying generation 3 failed",
            changes={
                "cleanup_state": "failed",
                "cleanup": {"failed_engine_id": engine_id, "error": "gloo destroy timed out"},
            },
        )


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """One Chromium for the dashboard tests (each test gets a fresh context: no shared state)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, coordinator: Coordinator) -> Iterator[Any]:
    """A page whose browser already holds the admin token (the token dialog has its own test)."""
    context = browser.new_context(viewport={"width": 1360, "height": 900}, base_url=coordinator.url)
    context.add_init_script(f"localStorage.setItem('epctl.token', {coordinator.admin_token!r})")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(10_000)
    try:
        yield page
        assert not errors, f"script errors on the page: {errors}"
    finally:
        context.close()


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
