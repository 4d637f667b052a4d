"""`epctl scale` and `epctl jobs` against a real coordinator process (uvicorn, SQLite file), job runner
off: where a job must move, the test moves it through the state machine against the coordinator's own
database, as the runner would (`tests.support.job_driver`). The test with real agents is in
test_scale_local.py."""

from __future__ import annotations

import json

import httpx

from tests.cli.epctl_runner import active_job_id, engine_ids, epctl, in_background, scale_job_id
from tests.support.job_driver import JobDriver, create_static_deployment, drive_to_rollback, drive_to_success
from tests.support.processes import Coordinator


def test_scale_creates_a_job_recorded_as_requested_by_the_cli(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    result = epctl(coordinator, "scale", deployment_name, "3", "--reason", "load test", "--json")
    assert result.exit_code == 0, result.output
    job = api.get(f"/v1/reconfigurations/{json.loads(result.stdout)['id']}").json()
    assert (job["requested_by"], job["to_dp_size"], job["reason"]) == ("cli", 3, "load test")


def test_second_scale_is_refused_naming_the_active_job(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    first = epctl(coordinator, "scale", deployment_name, "3", "--json")
    first_id = json.loads(first.stdout)["id"]
    second = epctl(coordinator, "scale", deployment_name, "1")
    assert second.exit_code == 1
    assert "Error 409" in second.stderr and first_id in second.stderr


def test_jobs_list_filters_by_deployment_and_state(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = json.loads(epctl(coordinator, "scale", deployment_name, "3", "--json").stdout)["id"]
    drive_to_rollback(JobDriver(coordinator.database_url, job_id), engine_id=f"{deployment_name}-e2")
    pending_id = json.loads(epctl(coordinator, "scale", deployment_name, "1", "--json").stdout)["id"]

    rolled_back = epctl(
        coordinator, "jobs", "list", "-d", deployment_name, "--state", "rolled_back", "--json"
    )
    assert [j["id"] for j in json.loads(rolled_back.stdout)["data"]] == [job_id]
    both = epctl(coordinator, "jobs", "list", "-d", deployment_name, "--source", "cli", "--since", "1h")
    assert both.exit_code == 0, both.output
    assert job_id in both.stdout and pending_id in both.stdout


def test_jobs_list_follows_the_cursor_with_all(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    ids = []
    for target in ("3", "1", "3"):
        job_id = json.loads(epctl(coordinator, "scale", deployment_name, target, "--json").stdout)["id"]
        JobDriver(coordinator.database_url, job_id).move("pending", "cancelled", "test")
        ids.append(job_id)
    one_page = json.loads(
        epctl(coordinator, "jobs", "list", "-d", deployment_name, "-n", "2", "--json").stdout
    )
    every_page = json.loads(
        epctl(coordinator, "jobs", "list", "-d", deployment_name, "-n", "2", "--all", "--json").stdout
    )
    assert len(one_page["data"]) == 2 and one_page["next_cursor"]
    assert [j["id"] for j in every_page["data"]] == list(reversed(ids))


def test_jobs_show_prints_phases_engines_and_the_transition_log(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = scale_job_id(coordinator, deployment_name, 3)
    drive_to_success(JobDriver(coordinator.database_url, job_id), engine_ids(deployment_name))
    result = epctl(coordinator, "jobs", "show", job_id)
    assert result.exit_code == 0, result.output
    for expected in (
        "succeeded",
        "downtime:",
        "preparing",
        "cleaning_up",
        f"{deployment_name}-e2",
        "joining",
        "pending -> preparing",
        "old groups destroyed",
    ):
        assert expected in result.stdout


def test_jobs_cancel_cancels_a_pending_job(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = json.loads(epctl(coordinator, "scale", deployment_name, "3", "--json").stdout)["id"]
    result = epctl(coordinator, "jobs", "cancel", job_id)
    assert result.exit_code == 0, result.output
    assert api.get(f"/v1/reconfigurations/{job_id}").json()["state"] == "cancelled"


def test_scale_wait_follows_the_job_to_success_and_prints_the_summary(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    engines = [f"{deployment_name}-e{i}" for i in range(3)]

    def drive() -> None:
        job_id = active_job_id(api, deployment_name)
        drive_to_success(
            JobDriver(coordinator.database_url, job_id), engines, pause_ms=14.0, step_delay_s=0.15
        )

    thread, errors = in_background(drive)
    result = epctl(coordinator, "scale", deployment_name, "3", "--wait", "--timeout", "30")
    thread.join(timeout=30)
    assert not errors, errors
    assert result.exit_code == 0, result.output
    lines = result.stdout
    assert "event stream unavailable" not in lines  # followed through the SSE endpoint
    assert "preparing" in lines and "syncing" in lines  # progress lines as the job moved
    assert "succeeded" in lines and "downtime: 14" in lines
    for engine_id in engines:
        assert engine_id in lines


def test_scale_wait_exits_1_with_the_error_when_the_job_rolls_back(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)

    def drive() -> None:
        job_id = active_job_id(api, deployment_name)
        drive_to_rollback(
            JobDriver(coordinator.database_url, job_id),
            engine_id=f"{deployment_name}-e2",
            message="agent unreachable: connection refused",
        )

    thread, errors = in_background(drive)
    result = epctl(coordinator, "scale", deployment_name, "3", "--wait", "--timeout", "30")
    thread.join(timeout=30)
    assert not errors, errors
    assert result.exit_code == 1
    assert "rolled_back" in result.stdout
    assert "agent unreachable: connection refused" in result.stderr
    assert f"engine_id={deployment_name}-e2" in result.stderr and "phase=preparing" in result.stderr


def test_jobs_watch_json_prints_the_final_job(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = scale_job_id(coordinator, deployment_name, 3)
    drive_to_success(JobDriver(coordinator.database_url, job_id), engine_ids(deployment_name))
    result = epctl(coordinator, "jobs", "watch", job_id, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == "succeeded"


def test_watch_timeout_gives_up_with_exit_1_and_leaves_the_job_running(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = json.loads(epctl(coordinator, "scale", deployment_name, "3", "--json").stdout)["id"]
    result = epctl(coordinator, "jobs", "watch", job_id, "--timeout", "1")
    assert result.exit_code == 1
    assert "did not finish in time" in result.stderr
    assert api.get(f"/v1/reconfigurations/{job_id}").json()["state"] == "pending"
