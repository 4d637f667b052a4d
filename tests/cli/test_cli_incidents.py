"""`epctl incidents list|show` against a real coordinator process: an incident the record holds (opened
as the status writer opens one) is listed with what was lost and what clients saw, and shown."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
from sqlmodel import Session, select

from app.core.clock import utc_now
from app.core.db import make_engine
from app.deployments.models import Deployment, DeploymentStatus, StatusDetail
from app.deployments.status import set_status
from tests.cli.epctl_runner import epctl
from tests.support.job_driver import create_static_deployment
from tests.support.processes import Coordinator


def test_incidents_are_listed_and_shown(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=2)
    engine = make_engine(coordinator.database_url)
    try:
        with Session(engine) as session:
            deployment = session.exec(select(Deployment).where(Deployment.name == deployment_name)).one()
            deployment.heal_loss_at = utc_now() - timedelta(seconds=3)
            detail = StatusDetail(reason="engine-stalled", message="x stopped answering", since=utc_now())
            set_status(session, deployment, DeploymentStatus.degraded, detail)
            session.commit()
            set_status(session, deployment, DeploymentStatus.ready)
            session.commit()
    finally:
        engine.dispose()
    listed = epctl(coordinator, "incidents", "list", "-d", deployment_name)
    assert listed.exit_code == 0, listed.output
    assert "engine-stalled" in listed.stdout and "resolved" in listed.stdout
    (incident,) = json.loads(epctl(coordinator, "incidents", "list", "--json").stdout)["data"]
    shown = epctl(coordinator, "incidents", "show", incident["id"])
    assert shown.exit_code == 0, shown.output
    assert "x stopped answering" in shown.stdout and "serving again after 3" in shown.stdout
