"""`epctl scale --retire` reaches the API; `epctl jobs show` prints the rank map and what moved."""

from __future__ import annotations

import httpx
from sqlmodel import Session

from app.jobs.transitions import append_event
from tests.cli.epctl_runner import engine_ids, epctl, scale_job_id
from tests.support.job_driver import JobDriver, create_static_deployment, drive_to_success
from tests.support.processes import Coordinator


def test_scale_retire_is_sent_and_a_retire_on_scale_up_is_refused_with_exit_1(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    result = epctl(coordinator, "scale", deployment_name, "2", "--retire", f"{deployment_name}-e1")
    assert result.exit_code == 1
    assert "retire" in result.output and "scale-down only" in result.output
    assert api.get("/v1/reconfigurations", params={"deployment": deployment_name}).json()["count"] == 0


def test_jobs_show_prints_the_copies_moved_and_the_rank_map(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = scale_job_id(coordinator, deployment_name, 3)
    driver = JobDriver(coordinator.database_url, job_id)
    drive_to_success(driver, engine_ids(deployment_name))
    first, second = engine_ids(deployment_name, 2)
    with Session(driver.engine) as session:
        append_event(
            session,
            job_id=job_id,
            kind="plan",
            changes={
                "placement": {
                    "rank_map": {first: {"old": 0, "new": 0}, second: {"old": 1, "new": None}},
                    "copies_moved": 7,
                    "bytes_moved": 7 << 20,
                    "lower_bound": 5,
                    "layers": 2,
                }
            },
        )
    result = epctl(coordinator, "jobs", "show", job_id, "--no-log")
    assert result.exit_code == 0, result.output
    assert "7 expert copies moved (7.0 MiB), lower bound 5; 2 layer(s)" in result.stdout
    assert f"{first} 0->0" in result.stdout and f"{second} 1->-" in result.stdout
