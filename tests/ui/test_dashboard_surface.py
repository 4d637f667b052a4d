"""The dashboard read at a glance, in headless Chromium against a real coordinator: the client outage
beside the downtime in every list ("not measured" where no canary ran), a self-heal job with its loss,
detection and serving-again times and a link to its incident, an incident page that links its jobs, a
cancelled job without a new generation or an error's colours, live progress in a long step, one clock
(UTC, named) and one duration format, chart labels that say what a job did, and lists that fit 760 px.
Its own module: its coordinator holds an incident. EPCTL_DOCS_IMAGES=1 refreshes the screenshots
committed under docs/images/dashboard/."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from playwright.sync_api import expect
from sqlmodel import Session, select

from app.core.clock import utc_now
from app.core.db import make_engine
from app.deployments.incidents import outage
from app.deployments.incidents import service as incidents
from app.deployments.models import Deployment, DeploymentStatus, StatusDetail
from app.deployments.status import set_status
from app.jobs import incident_outage
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import create_reconfiguration
from tests.support.job_driver import JobDriver, create_static_deployment, drive_to_success
from tests.support.processes import ROOT, Coordinator
from tests.ui.conftest import SCREENSHOTS, screenshot

pytestmark = pytest.mark.processes

DOCS_IMAGES = ROOT / "docs" / "images" / "dashboard"
PROBE = {
    "canaries_sent": 124,
    "canaries_failed": 40,
    "canaries_late": 0,
    "targets": 3,
    "interval_ms": 20.0,
    "deadline_ms": 1000.0,
    "outage_phase": "prepare",
    "phases": {},
}


@dataclass
class Surface:
    measured: str  # clients lost 4.55 s in prepare; the engines paused 6.67 ms
    unmeasured: str  # its probe sent no canary: a 0 nobody saw
    heal: str  # a self-heal job, recovering from `incident`
    incident: str
    cancelled: str  # cancelled during preparing
    launching: str  # still launching engines
    leaver: str  # 2 canaries failed (the leaver's 503s) while the others answered: no outage


def _scale(api: Any, deployment: str, target: int) -> str:
    response = api.post("/v1/reconfigurations", json={"deployment": deployment, "target_dp_size": target})
    response.raise_for_status()
    return str(response.json()["id"])


def _finish(coordinator: Coordinator, job_id: str, engines: list[str], **figures: Any) -> None:
    driver = JobDriver(coordinator.database_url, job_id)
    try:
        drive_to_success(driver, engines, pause_ms=6.67)
        if figures:
            from app.jobs.transitions import append_event

            with Session(driver.engine) as session:
                append_event(session, job_id=job_id, kind="probe", message="canaries", changes=figures)
    finally:
        driver.close()


@pytest.fixture(scope="module")
def surface(coordinator: Coordinator) -> Surface:
    engines = [f"gamma-e{i}" for i in range(3)]
    with coordinator.client() as api:
        create_static_deployment(api, "gamma", engines=3)
        create_static_deployment(api, "epsilon", engines=3)
        measured = _scale(api, "gamma", 3)
        _finish(coordinator, measured, engines, client_outage_ms=4550.0, probe=PROBE)
        unmeasured = _scale(api, "gamma", 3)
        _finish(
            coordinator,
            unmeasured,
            engines,
            client_outage_ms=0.0,
            probe={**PROBE, "canaries_sent": 0, "canaries_failed": 0},
        )
        leaver = _scale(api, "gamma", 2)
        leaver_probe = {**PROBE, "canaries_failed": 2, "outage_phase": None}
        _finish(coordinator, leaver, engines, client_outage_ms=0.0, probe=leaver_probe)
        cancelled = _scale(api, "gamma", 2)
        driver = JobDriver(coordinator.database_url, cancelled)
        driver.move("pending", "preparing", "claimed", progress_step="preparing", progress_percent=10.0)
        driver.move(
            "preparing",
            "cancelled",
            "cancelled on request",
            error={"phase": "preparing", "type": "cancelled", "message": "cancelled by admin"},
        )
        driver.close()
        launching = _scale(api, "epsilon", 3)
        driver = JobDriver(coordinator.database_url, launching)
        driver.move("pending", "preparing", "claimed", progress_step="preparing", progress_percent=0.0)
        driver.progress("launching", 0.0)
        driver.close()
    heal, incident = _self_heal(coordinator, "gamma", engines)
    return Surface(measured, unmeasured, heal, incident, cancelled, launching, leaver)


def _self_heal(
    coordinator: Coordinator, name: str, engines: list[str], *, names_incident: bool = True
) -> tuple[str, str]:
    """`name` loses an engine: its incident opens, a self-heal job recovers (naming the incident, as the
    liveness pass has it do; `names_incident=False`: as it did before, the incident alone naming the
    job), the deployment serves again and the clients' outage is measured."""
    db = make_engine(coordinator.database_url)
    try:
        with Session(db) as session:
            deployment = session.exec(select(Deployment).where(Deployment.name == name)).one()
            loss_at = utc_now() - timedelta(seconds=3)
            deployment.heal_loss_at = loss_at
            lost = f"{engines[-1]} stopped answering"
            detail = StatusDetail(reason="engine-lost", message=lost, since=utc_now())
            set_status(session, deployment, DeploymentStatus.degraded, detail)
            session.commit()

            def note(session: Session, job: ReconfigurationJob) -> None:
                job.loss_at, job.time_to_detect_ms = loss_at, 812.0
                named = incidents.note_recovery_job(session, deployment.id, job.id)
                job.incident_id = named if names_incident else None
                session.add(job)

            request = ReconfigurationCreate(deployment=name, target_dp_size=2, reason="an engine lost")
            heal = create_reconfiguration(
                session, request=request, requested_by=RequestSource.self_heal, on_created=note
            ).job.id
        _finish(coordinator, heal, engines[:2], time_to_serving_ms=1800.0)
        with Session(db) as session:
            deployment = session.exec(select(Deployment).where(Deployment.name == name)).one()
            set_status(session, deployment, DeploymentStatus.ready)
            session.commit()
            (opened,) = incidents.list_incidents(session, deployment_id=deployment.id)
            measured = outage.ClientOutage(1800.0, opened.loss_at, outage.OutageSource.canaries)
            incident_outage.record_client_outage(session, opened.id, measured)
            return heal, opened.id
    finally:
        db.dispose()


def keep(page: Any, name: str, element: Any = None) -> None:
    """A screenshot in the test artifacts; with EPCTL_DOCS_IMAGES=1 also the docs' copy (the viewport or
    one element only, in a 128-colour palette: small files, and a plain test run leaves the tree clean)."""
    path = screenshot(page, name) if element is None else SCREENSHOTS / f"{name}.png"
    if element is not None:
        element.screenshot(path=str(path))
    if os.environ.get("EPCTL_DOCS_IMAGES") != "1":
        return
    from PIL import Image

    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    shot = path if element is not None else DOCS_IMAGES / f"{name}.png"
    if element is None:
        page.screenshot(path=str(shot))
    Image.open(shot).convert("RGB").quantize(colors=128).save(DOCS_IMAGES / f"{name}.png", optimize=True)


def cell(page: Any, job_id: str, name: str) -> Any:
    return page.locator(f'#jobs-body tr[data-job="{job_id}"] td.{name}')


def test_the_job_list_shows_the_client_outage_beside_the_downtime(page: Any, surface: Surface) -> None:
    page.goto("/ui/?deployment=gamma")
    expect(cell(page, surface.measured, "downtime")).to_have_text("6.67 ms")
    expect(cell(page, surface.measured, "client-outage")).to_have_text("4.55 s")
    expect(cell(page, surface.unmeasured, "client-outage")).to_have_text("not measured")
    expect(cell(page, surface.heal, "client-outage")).to_have_text("1.80 s")  # the incident's, shared
    headers = page.locator("#jobs-table thead th").all_inner_texts()
    assert headers[-2:] == ["Downtime", "Client outage"], headers
    created = cell(page, surface.measured, "created").text_content()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", created or ""), created
    assert "Created (UTC)" in headers


def test_failed_canaries_without_an_outage_say_another_engine_answered(page: Any, surface: Surface) -> None:
    page.goto(f"/ui/jobs/{surface.leaver}")
    expect(page.locator("#card-client-outage")).to_have_text("0 ms 2 failed, answered elsewhere")


def test_chart_labels_say_what_each_job_did_and_when(page: Any, surface: Surface) -> None:
    page.goto("/ui/?deployment=gamma")
    label = page.locator(f'svg.downtime-chart text.bar-label[data-label-job="{surface.measured}"]')
    expect(label).to_have_text(re.compile(r"^\d+ → 3$"))  # the size change, not an id's tail
    labels = page.locator("svg.downtime-chart text.bar-label").all_text_contents()
    assert all(surface.measured[-6:] not in text for text in labels)


def test_a_self_heal_job_shows_its_loss_its_recovery_and_its_incident(page: Any, surface: Surface) -> None:
    page.goto(f"/ui/jobs/{surface.heal}")
    panel = page.locator("#self-heal-panel")
    expect(panel).to_contain_text("Self-heal")
    expect(page.locator("#heal-detect")).to_have_text("812 ms")
    expect(page.locator("#heal-serving")).to_have_text("1.80 s")
    expect(page.locator("#heal-loss")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
    expect(page.locator("#heal-outage")).to_contain_text("1.80 s")
    expect(page.locator("#card-client-outage")).to_contain_text("1.80 s")
    keep(page, "self-heal-job")
    page.locator("#job-incident").click()
    expect(page).to_have_url(re.compile(f"/ui/incidents/{surface.incident}$"))


def test_a_self_heal_job_recorded_before_it_named_its_incident_still_links_it(
    page: Any, coordinator: Coordinator, surface: Surface
) -> None:
    with coordinator.client() as api:
        create_static_deployment(api, "zeta", engines=3)
    heal, incident = _self_heal(coordinator, "zeta", [f"zeta-e{i}" for i in range(3)], names_incident=False)
    with coordinator.client() as api:
        assert api.get(f"/v1/reconfigurations/{heal}").json()["incident_id"] is None
    page.goto(f"/ui/jobs/{heal}")
    expect(page.locator("#job-incident")).to_have_text(incident)
    expect(page.locator("#heal-outage")).to_contain_text("1.80 s")


def test_the_incident_page_links_its_jobs(page: Any, surface: Surface) -> None:
    page.goto("/ui/")
    page.locator(f'#incidents-body tr[data-incident="{surface.incident}"] a').click()
    expect(page).to_have_url(re.compile(f"/ui/incidents/{surface.incident}$"))
    expect(page.locator("#incident-state")).to_have_text("resolved")
    expect(page.locator("#incident-outage")).to_contain_text("1.80 s")
    row = page.locator(f'#incident-jobs tr[data-job="{surface.heal}"]')
    expect(row).to_contain_text("self-heal")
    expect(row).to_contain_text("succeeded")
    expect(row.locator("td.client-outage")).to_have_text("1.80 s")
    keep(page, "incident")
    row.locator("a").click()
    expect(page).to_have_url(re.compile(f"/ui/jobs/{surface.heal}$"))


def test_a_cancelled_job_shows_no_new_generation_and_no_error_colours(page: Any, surface: Surface) -> None:
    page.goto(f"/ui/jobs/{surface.cancelled}")
    expect(page.locator("#card-generation")).to_have_text(re.compile(r"^\d+ \(unchanged\)$"))
    notice = page.locator("#job-error")
    expect(notice).to_contain_text("Cancelled during preparing")
    expect(notice).to_have_class(re.compile(r"\binfo\b"))
    assert page.locator(".alert.bad, .alert.warn, .step.bad, .progress-fill.warn").count() == 0
    expect(page.locator('.step.stopped[data-step="preparing"]')).to_be_visible()
    keep(page, "cancelled-job")


def test_a_long_launch_shows_the_time_in_its_step(page: Any, surface: Surface) -> None:
    page.goto(f"/ui/jobs/{surface.launching}")
    expect(page.locator("#progress-step")).to_contain_text("launching")
    elapsed = page.locator("#progress-elapsed")
    expect(elapsed).to_contain_text("in this step")
    first = elapsed.inner_text()
    expect(elapsed).not_to_have_text(first)  # it moves with the clock between events
    expect(page.locator("#progress-fill")).to_have_class(re.compile(r"\bbusy\b"))
    duration = page.locator("#card-duration-value")
    before = duration.inner_text()
    expect(duration).not_to_have_text(before)  # the card moves with the clock, as the timeline does
    ran = re.search(r"ran ([\d.]+ (?:ms|s|min))", page.locator("#timeline-note").inner_text())
    assert ran is not None


def test_every_time_on_a_job_page_is_utc_and_named(page: Any, surface: Surface) -> None:
    page.goto(f"/ui/jobs/{surface.heal}")
    expect(page.locator("#events-table")).to_be_visible()
    text = page.locator("#view").inner_text()
    assert not re.search(r"\d{1,2}/\d{1,2}/\d{4}|\b[AP]M\b", text), "a locale time on the page"
    assert "Time (UTC)" in text
    for stamp in re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: UTC)?", text):
        assert stamp.endswith("UTC"), stamp


def _fits(page: Any, selector: str) -> None:
    width = page.evaluate(
        """(sel) => { const t = document.querySelector(sel); const wrap = t.closest('.table-wrap');
        return [t.scrollWidth, wrap.clientWidth]; }""",
        selector,
    )
    assert width[0] <= width[1], f"{selector} is {width[0]} px wide in {width[1]} px"


def test_the_lists_fit_760_px(page: Any, surface: Surface) -> None:
    page.set_viewport_size({"width": 760, "height": 1000})
    page.goto("/ui/")
    expect(cell(page, surface.measured, "client-outage")).to_have_text("4.55 s")
    expect(page.locator("#incidents-panel")).to_be_visible()
    keep(page, "history-760px")
    keep(page, "jobs-list-760px", page.locator("#jobs-table"))
    for table in ("#jobs-table", "#incidents-table", "#deployments-table"):
        _fits(page, table)
    assert page.evaluate("document.documentElement.scrollWidth") <= 760
    page.goto(f"/ui/incidents/{surface.incident}")
    expect(page.locator("#incident-jobs")).to_be_visible()
    _fits(page, "#incident-jobs")
    page.goto(f"/ui/jobs/{surface.heal}")
    expect(page.locator("#events-table")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 760


def test_a_browser_in_another_zone_still_reads_and_writes_utc(
    browser: Any, coordinator: Coordinator, surface: Surface
) -> None:
    context = browser.new_context(base_url=coordinator.url, timezone_id="Asia/Kolkata")  # UTC+05:30
    context.add_init_script(f"localStorage.setItem('epctl.token', {coordinator.admin_token!r})")
    try:
        page = context.new_page()
        with coordinator.client() as api:
            created = api.get(f"/v1/reconfigurations/{surface.measured}").json()["created_at"]
        page.goto("/ui/?deployment=gamma")
        shown = cell(page, surface.measured, "created").text_content() or ""
        assert shown == created.replace("T", " ")[:19], (shown, created)
        page.fill("#f-after", "2026-01-01T00:00")
        page.click("#f-apply")
        expect(page).to_have_url(re.compile(r"created_after=2026-01-01T00%3A00%3A00\.000Z"))
    finally:
        context.close()
