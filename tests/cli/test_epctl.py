"""`epctl` against a real coordinator process (uvicorn, SQLite file).

The job runner is off in this module: where a job must move, the test moves it through the state machine
(`app.jobs.states.transition`) against the coordinator's own database, as the runner would. The test with
real agents is in test_scale_local.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from click.testing import Result
from typer.testing import CliRunner

from app.cli.main import app as cli_app
from tests.cli.support import (
    ROOT,
    CoordinatorProcess,
    JobDriver,
    create_static_deployment,
    drive_to_rollback,
    drive_to_success,
)

runner = CliRunner()


def epctl(coordinator: CoordinatorProcess, *args: str, token: str | None = None) -> Result:
    env = {"EPCTL_URL": coordinator.url, "EPCTL_TOKEN": token or coordinator.admin_token}
    return runner.invoke(cli_app, list(args), env=env)


def scale_job_id(coordinator: CoordinatorProcess, deployment: str, target: int) -> str:
    result = epctl(coordinator, "scale", deployment, str(target), "--json")
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["id"])


def engine_ids(deployment: str, count: int = 3) -> list[str]:
    return [f"{deployment}-e{i}" for i in range(count)]


def active_job_id(api: httpx.Client, deployment: str, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job_id = api.get(f"/v1/deployments/{deployment}").json().get("active_job_id")
        if job_id:
            return str(job_id)
        time.sleep(0.05)
    raise AssertionError(f"no active job appeared for {deployment}")


def in_background(work: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the test after join
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


# --- deployments and engines ----------------------------------------------------------------------


def test_deployments_create_then_list_shows_it(coordinator: CoordinatorProcess, deployment_name: str) -> None:
    created = epctl(coordinator, "deployments", "create", deployment_name, "--min", "1", "--max", "4",
                    "--launcher", "static", "--warmup-policy", "deferred")
    assert created.exit_code == 0, created.output
    listed = epctl(coordinator, "deployments", "list")
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.stdout.splitlines() if line.startswith(deployment_name))
    assert "1..4" in row and "deferred" in row and "static" in row


def test_json_flag_prints_the_api_document(coordinator: CoordinatorProcess, api: httpx.Client,
                                           deployment_name: str) -> None:
    create_static_deployment(api, deployment_name, engines=2)
    result = epctl(coordinator, "deployments", "show", deployment_name, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == deployment_name


def test_deployments_update_changes_only_the_given_fields(coordinator: CoordinatorProcess, api: httpx.Client,
                                                          deployment_name: str) -> None:
    create_static_deployment(api, deployment_name, engines=2)
    result = epctl(coordinator, "deployments", "update", deployment_name, "--max", "6", "--json")
    assert result.exit_code == 0, result.output
    updated = json.loads(result.stdout)
    assert (updated["min_dp_size"], updated["max_dp_size"]) == (1, 6)


def test_deployments_delete_removes_an_idle_deployment(coordinator: CoordinatorProcess, api: httpx.Client,
                                                       deployment_name: str) -> None:
    create_static_deployment(api, deployment_name, engines=0)
    result = epctl(coordinator, "deployments", "delete", deployment_name, "--yes")
    assert result.exit_code == 0, result.output
    assert api.get(f"/v1/deployments/{deployment_name}").status_code == 404


def test_engines_list_shows_registered_engines(coordinator: CoordinatorProcess, api: httpx.Client,
                                               deployment_name: str) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    result = epctl(coordinator, "engines", "list", "--deployment", deployment_name)
    assert result.exit_code == 0, result.output
    engine_lines = [line for line in result.stdout.splitlines() if line.startswith(f"{deployment_name}-e")]
    assert len(engine_lines) == 3


# --- errors ----------------------------------------------------------------------------------------


def test_problem_answer_is_printed_readably_with_exit_1(coordinator: CoordinatorProcess) -> None:
    result = epctl(coordinator, "deployments", "show", "no-such-deployment")
    assert result.exit_code == 1
    assert "Error 404" in result.stderr and "no-such-deployment" in result.stderr


def test_bad_token_is_refused_with_exit_1(coordinator: CoordinatorProcess) -> None:
    result = epctl(coordinator, "jobs", "list", token="not-a-real-token-at-all")
    assert result.exit_code == 1
    assert "Error 401" in result.stderr


def test_validation_errors_name_the_field(coordinator: CoordinatorProcess, api: httpx.Client,
                                          deployment_name: str) -> None:
    create_static_deployment(api, deployment_name, engines=2, max_dp_size=4)
    result = epctl(coordinator, "scale", deployment_name, "9")
    assert result.exit_code == 1
    assert "Error 4" in result.stderr and "9" in result.stderr


def test_unreachable_coordinator_exits_3() -> None:
    result = runner.invoke(cli_app, ["jobs", "list", "--url", "http://127.0.0.1:9", "--token", "x"])
    assert result.exit_code == 3
    assert "cannot reach the coordinator" in result.stderr


def test_installed_console_script_reads_url_and_token_from_the_environment(
    coordinator: CoordinatorProcess, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=1)
    env = {**os.environ, "EPCTL_URL": coordinator.url, "EPCTL_TOKEN": coordinator.admin_token}
    completed = subprocess.run([str(ROOT / ".venv" / "bin" / "epctl"), "deployments", "list", "--json"],
                               env=env, capture_output=True, text=True, timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr
    assert deployment_name in {d["name"] for d in json.loads(completed.stdout)["data"]}


# --- scale and jobs -----------------------------------------------------------------------------------


def test_scale_creates_a_job_recorded_as_requested_by_the_cli(
    coordinator: CoordinatorProcess, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    result = epctl(coordinator, "scale", deployment_name, "3", "--reason", "load test", "--json")
    assert result.exit_code == 0, result.output
    job = api.get(f"/v1/reconfigurations/{json.loads(result.stdout)['id']}").json()
    assert (job["requested_by"], job["to_dp_size"], job["reason"]) == ("cli", 3, "load test")


def test_second_scale_is_refused_naming_the_active_job(
    coordinator: CoordinatorProcess, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    first = epctl(coordinator, "scale", deployment_name, "3", "--json")
    first_id = json.loads(first.stdout)["id"]
    second = epctl(coordinator, "scale", deployment_name, "1")
    assert second.exit_code == 1
    assert "Error 409" in second.stderr and first_id in second.stderr


def test_jobs_list_filters_by_deployment_and_state(
    coordinator: CoordinatorProcess, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = json.loads(epctl(coordinator, "scale", deployment_name, "3", "--json").stdout)["id"]
    drive_to_rollback(JobDriver(coordinator.database_url, job_id), engine_id=f"{deployment_name}-e2")
    pending_id = json.loads(epctl(coordinator, "scale", deployment_name, "1", "--json").stdout)["id"]

    rolled_back = epctl(coordinator, "jobs", "list", "-d", deployment_name, "--state", "rolled_back",
                        "--json")
    assert [j["id"] for j in json.loads(rolled_back.stdout)["data"]] == [job_id]
    both = epctl(coordinator, "jobs", "list", "-d", deployment_name, "--source", "cli", "--since", "1h")
    assert both.exit_code == 0, both.output
    assert job_id in both.stdout and pending_id in both.stdout


def test_jobs_list_follows_the_cursor_with_all(coordinator: CoordinatorProcess, api: httpx.Client,
                                               deployment_name: str) -> None:
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
    coordinator: CoordinatorProcess, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = scale_job_id(coordinator, deployment_name, 3)
    drive_to_success(JobDriver(coordinator.database_url, job_id), engine_ids(deployment_name))
    result = epctl(coordinator, "jobs", "show", job_id)
    assert result.exit_code == 0, result.output
    for expected in ("succeeded", "downtime:", "preparing", "cleaning_up", f"{deployment_name}-e2", "joining",
                     "pending -> preparing", "old groups destroyed"):
        assert expected in result.stdout


def test_jobs_cancel_cancels_a_pending_job(coordinator: CoordinatorProcess, api: httpx.Client,
                                           deployment_name: str) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = json.loads(epctl(coordinator, "scale", deployment_name, "3", "--json").stdout)["id"]
    result = epctl(coordinator, "jobs", "cancel", job_id)
    assert result.exit_code == 0, result.output
    assert api.get(f"/v1/reconfigurations/{job_id}").json()["state"] == "cancelled"


def test_scale_wait_follows_the_job_to_success_and_prints_the_summary(
    coordinator: CoordinatorProcess, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    engines = [f"{deployment_name}-e{i}" for i in range(3)]

    def drive() -> None:
        job_id = active_job_id(api, deployment_name)
        drive_to_success(JobDriver(coordinator.database_url, job_id), engines, pause_ms=14.0,
                         step_delay_s=0.15)

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
    coordinator: CoordinatorProcess, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)

    def drive() -> None:
        job_id = active_job_id(api, deployment_name)
        drive_to_rollback(JobDriver(coordinator.database_url, job_id), engine_id=f"{deployment_name}-e2",
                          message="agent unreachable: connection refused")

    thread, errors = in_background(drive)
    result = epctl(coordinator, "scale", deployment_name, "3", "--wait", "--timeout", "30")
    thread.join(timeout=30)
    assert not errors, errors
    assert result.exit_code == 1
    assert "rolled_back" in result.stdout
    assert "agent unreachable: connection refused" in result.stderr
    assert f"engine_id={deployment_name}-e2" in result.stderr and "phase=preparing" in result.stderr


def test_jobs_watch_json_prints_the_final_job(coordinator: CoordinatorProcess, api: httpx.Client,
                                              deployment_name: str) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = scale_job_id(coordinator, deployment_name, 3)
    drive_to_success(JobDriver(coordinator.database_url, job_id), engine_ids(deployment_name))
    result = epctl(coordinator, "jobs", "watch", job_id, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == "succeeded"


def test_watch_timeout_gives_up_with_exit_1_and_leaves_the_job_running(
    coordinator: CoordinatorProcess, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = json.loads(epctl(coordinator, "scale", deployment_name, "3", "--json").stdout)["id"]
    result = epctl(coordinator, "jobs", "watch", job_id, "--timeout", "1")
    assert result.exit_code == 1
    assert "did not finish in time" in result.stderr
    assert api.get(f"/v1/reconfigurations/{job_id}").json()["state"] == "pending"


# --- cleanup ----------------------------------------------------------------------------------------


def _job_with_failed_cleanup(coordinator: CoordinatorProcess, api: httpx.Client, deployment: str) -> str:
    create_static_deployment(api, deployment, engines=3)
    job_id = json.loads(epctl(coordinator, "scale", deployment, "3", "--json").stdout)["id"]
    driver = JobDriver(coordinator.database_url, job_id)
    drive_to_success(driver, [f"{deployment}-e{i}" for i in range(3)])
    from sqlmodel import Session

    from app.jobs.states import append_event

    failure = {"failed_engine_id": f"{deployment}-e1", "error": "destroy timed out"}
    with Session(driver.engine) as session:
        append_event(session, job_id=job_id, kind="cleanup", message="destroying generation 1 failed",
                     changes={"cleanup_state": "failed", "cleanup": failure})
    return job_id


def test_cleanup_ack_resolves_a_failed_cleanup(coordinator: CoordinatorProcess, api: httpx.Client,
                                              deployment_name: str) -> None:
    job_id = _job_with_failed_cleanup(coordinator, api, deployment_name)
    shown = epctl(coordinator, "jobs", "show", job_id)
    assert "cleanup failed" in shown.stdout and "destroy timed out" in shown.stdout
    result = epctl(coordinator, "cleanup", "ack", job_id)
    assert result.exit_code == 0, result.output
    assert "acknowledged" in result.stdout
    assert api.get(f"/v1/reconfigurations/{job_id}").json()["cleanup_state"] == "acknowledged"


def test_cleanup_retry_on_an_unreachable_engine_is_refused_naming_it(
    coordinator: CoordinatorProcess, api: httpx.Client, deployment_name: str
) -> None:
    job_id = _job_with_failed_cleanup(coordinator, api, deployment_name)
    result = epctl(coordinator, "cleanup", "retry", job_id)
    assert result.exit_code == 1
    assert f"{deployment_name}-e1" in result.stderr


# --- webhooks -------------------------------------------------------------------------------------


@pytest.fixture
def webhooks_available(api: httpx.Client) -> None:
    if api.get("/v1/webhooks").status_code == 404:
        pytest.skip("the coordinator has no /v1/webhooks router registered")


@pytest.mark.usefixtures("webhooks_available")
def test_webhooks_create_shows_the_secret_once_then_list_and_delete(coordinator: CoordinatorProcess) -> None:
    created = epctl(coordinator, "webhooks", "create", "http://127.0.0.1:9/hook", "-e", "succeeded",
                    "-e", "failed", "--description", "ops channel")
    assert created.exit_code == 0, created.output
    assert "whsec_" in created.stdout
    listed = json.loads(epctl(coordinator, "webhooks", "list", "--json").stdout)
    subscription = next(s for s in listed["data"] if s.get("description") == "ops channel")
    assert set(subscription["event_types"]) == {"reconfiguration.succeeded", "reconfiguration.failed"}
    assert "whsec_" not in json.dumps(subscription)
    deliveries = epctl(coordinator, "webhooks", "deliveries", subscription["id"])
    assert deliveries.exit_code == 0, deliveries.output
    deleted = epctl(coordinator, "webhooks", "delete", subscription["id"])
    assert deleted.exit_code == 0, deleted.output
    remaining = json.loads(epctl(coordinator, "webhooks", "list", "--json").stdout)["data"]
    assert subscription["id"] not in {s["id"] for s in remaining}


def test_webhooks_create_rejects_an_unknown_event_type(coordinator: CoordinatorProcess) -> None:
    result = epctl(coordinator, "webhooks", "create", "http://127.0.0.1:9/hook", "-e", "exploded")
    assert result.exit_code == 2
    assert "unknown event" in result.output
