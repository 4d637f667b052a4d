"""`epctl cleanup` against a real coordinator process: acknowledging a failed cleanup, and a retry
refused while its engine is unreachable. The job is driven to its failed cleanup through the state
machine, as the runner would."""

from __future__ import annotations

import json

import httpx

from tests.cli.epctl_runner import epctl
from tests.support.job_driver import JobDriver, create_static_deployment, drive_to_success
from tests.support.processes import Coordinator


def _job_with_failed_cleanup(coordinator: Coordinator, api: httpx.Client, deployment: str) -> str:
    create_static_deployment(api, deployment, engines=3)
    job_id = json.loads(epctl(coordinator, "scale", deployment, "3", "--json").stdout)["id"]
    driver = JobDriver(coordinator.database_url, job_id)
    drive_to_success(driver, [f"{deployment}-e{i}" for i in range(3)])
    from sqlmodel import Session

    from app.jobs.transitions import append_event

    failure = {"failed_engine_id": f"{deployment}-e1", "error": "destroy timed out"}
    with Session(driver.engine) as session:
        append_event(
            session,
            job_id=job_id,
            kind="cleanup",
            message="destroying generation 1 failed",
            changes={"cleanup_state": "failed", "cleanup": failure},
        )
    return job_id


def test_cleanup_ack_resolves_a_failed_cleanup(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    job_id = _job_with_failed_cleanup(coordinator, api, deployment_name)
    shown = epctl(coordinator, "jobs", "show", job_id)
    assert "cleanup failed" in shown.stdout and "destroy timed out" in shown.stdout
    result = epctl(coordinator, "cleanup", "ack", job_id)
    assert result.exit_code == 0, result.output
    assert "acknowledged" in result.stdout
    assert api.get(f"/v1/reconfigurations/{job_id}").json()["cleanup_state"] == "acknowledged"


def test_cleanup_retry_on_an_unreachable_engine_is_refused_naming_it(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    job_id = _job_with_failed_cleanup(coordinator, api, deployment_name)
    result = epctl(coordinator, "cleanup", "retry", job_id)
    assert result.exit_code == 1
    assert f"{deployment_name}-e1" in result.stderr
