"""The dashboard's history lists incidents: what was lost, how long until serving again, what clients
saw, and the job it came right after (its own module: its coordinator holds an incident)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from playwright.sync_api import expect
from sqlmodel import Session, select

from app.core.clock import utc_now
from app.core.db import make_engine
from app.deployments.incidents import outage
from app.deployments.incidents import service as incidents
from app.deployments.models import Deployment, DeploymentStatus, StatusDetail
from app.deployments.status import set_status
from app.jobs import incident_outage
from tests.support.job_driver import create_static_deployment
from tests.support.processes import Coordinator
from tests.ui.conftest import screenshot


def test_an_incident_shows_with_its_figures(page: Any, coordinator: Coordinator) -> None:
    with coordinator.client() as api:
        create_static_deployment(api, "delta", engines=2)
    engine = make_engine(coordinator.database_url)
    try:
        with Session(engine) as session:
            deployment = session.exec(select(Deployment).where(Deployment.name == "delta")).one()
            deployment.heal_loss_at = utc_now() - timedelta(seconds=2)
            detail = StatusDetail(
                reason="engine-stalled", message="delta-e1 stopped answering", since=utc_now()
            )
            set_status(session, deployment, DeploymentStatus.degraded, detail)
            set_status(session, deployment, DeploymentStatus.ready)
            (opened,) = incidents.list_incidents(session, deployment_id=deployment.id)
            session.commit()
            measured = outage.ClientOutage(2000.0, opened.loss_at, outage.OutageSource.canaries)
            incident_outage.record_client_outage(session, opened.id, measured)
    finally:
        engine.dispose()
    page.goto("/ui/")
    row = page.locator("#incidents-body tr", has_text="delta")
    expect(row).to_contain_text("engine-stalled")
    cells = row.locator("td").all_inner_texts()
    assert cells[1:4] == ["delta", "resolved", "engine-stalled"]
    # one duration format (the CLI's): "2.03 s", never "2030 ms"; the outage its canaries measured
    assert re.fullmatch(r"\d+\.\d\d s", cells[6]) and cells[7] == "2.00 s", cells
    screenshot(page, "incidents")
