"""The commit mode and the downtime budget from the CLI: `epctl scale --commit --max-downtime-ms`,
`epctl deployments create|update --max-downtime-ms` (and `--no-max-downtime`), the launch timeout
(`--launch-timeout`, `--no-launch-timeout`), and what `epctl jobs show`
prints of them, including the engine and part a `downtime-budget-exceeded` rollback names."""

from __future__ import annotations

import json

import httpx

from tests.cli.epctl_runner import epctl
from tests.support.job_driver import JobDriver, create_static_deployment
from tests.support.processes import Coordinator


def test_scale_sends_the_commit_mode_and_budget_and_jobs_show_prints_them(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    result = epctl(
        coordinator,
        "scale",
        deployment_name,
        "3",
        "--commit",
        "coordinator",
        "--max-downtime-ms",
        "250",
        "--json",
    )
    assert result.exit_code == 0, result.output
    job = api.get(f"/v1/reconfigurations/{json.loads(result.stdout)['id']}").json()
    assert (job["commit"], job["max_downtime_ms"]) == ("coordinator", 250)
    shown = epctl(coordinator, "jobs", "show", job["id"], "--no-log")
    assert shown.exit_code == 0, shown.output
    assert "commit: coordinator" in shown.stdout and "downtime budget: 250 ms" in shown.stdout


def test_scale_with_bad_commit_or_budget_is_refused_naming_the_field_and_creates_nothing(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    no_budget = epctl(coordinator, "scale", deployment_name, "3", "--max-downtime-ms", "0")
    assert no_budget.exit_code == 1
    assert "Error 422" in no_budget.stderr and "max_downtime_ms" in no_budget.stderr
    bad_mode = epctl(coordinator, "scale", deployment_name, "3", "--commit", "sideways")
    assert bad_mode.exit_code == 1
    assert "Error 422" in bad_mode.stderr and "commit" in bad_mode.stderr
    assert api.get("/v1/reconfigurations", params={"deployment": deployment_name}).json()["count"] == 0


def test_deployment_budget_is_set_at_create_changed_and_turned_off_by_update(
    coordinator: Coordinator, deployment_name: str
) -> None:
    created = epctl(
        coordinator,
        "deployments",
        "create",
        deployment_name,
        "--launcher",
        "static",
        "--max-downtime-ms",
        "500",
    )
    assert created.exit_code == 0, created.output
    assert "downtime budget: 500 ms" in created.stdout
    changed = epctl(
        coordinator, "deployments", "update", deployment_name, "--max-downtime-ms", "200", "--json"
    )
    assert changed.exit_code == 0, changed.output
    assert json.loads(changed.stdout)["max_downtime_ms"] == 200
    off = epctl(coordinator, "deployments", "update", deployment_name, "--no-max-downtime", "--json")
    assert off.exit_code == 0, off.output
    assert json.loads(off.stdout)["max_downtime_ms"] is None
    both = epctl(
        coordinator, "deployments", "update", deployment_name, "--max-downtime-ms", "5", "--no-max-downtime"
    )
    assert both.exit_code == 2 and "not both" in both.output
    refused = epctl(coordinator, "deployments", "update", deployment_name, "--max-downtime-ms", "-3")
    assert refused.exit_code == 1 and "max_downtime_ms" in refused.stderr


def test_the_launch_timeout_is_set_at_create_changed_and_made_adaptive_by_update(
    coordinator: Coordinator, deployment_name: str
) -> None:
    created = epctl(
        coordinator,
        "deployments",
        "create",
        deployment_name,
        "--launcher",
        "static",
        "--launch-timeout",
        "180",
    )
    assert created.exit_code == 0, created.output
    assert "launch timeout: 180 s" in created.stdout
    changed = epctl(coordinator, "deployments", "update", deployment_name, "--launch-timeout", "90", "--json")
    assert changed.exit_code == 0, changed.output
    assert json.loads(changed.stdout)["launch_timeout_s"] == 90.0
    adaptive = epctl(coordinator, "deployments", "update", deployment_name, "--no-launch-timeout", "--json")
    assert adaptive.exit_code == 0, adaptive.output
    assert json.loads(adaptive.stdout)["launch_timeout_s"] is None
    both = epctl(
        coordinator, "deployments", "update", deployment_name, "--launch-timeout", "5", "--no-launch-timeout"
    )
    assert both.exit_code == 2 and "not both" in both.output
    refused = epctl(coordinator, "deployments", "update", deployment_name, "--launch-timeout", "0")
    assert refused.exit_code == 1 and "launch_timeout_s" in refused.stderr


def test_jobs_show_names_the_engine_and_part_that_overran_the_budget(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    job_id = json.loads(
        epctl(coordinator, "scale", deployment_name, "3", "--max-downtime-ms", "5", "--json").stdout
    )["id"]
    driver = JobDriver(coordinator.database_url, job_id)
    driver.move("pending", "preparing", "claimed by the test driver", warmup_policy="deferred")
    driver.move("preparing", "syncing", "every engine prepared")
    driver.move("syncing", "committing", "synced")
    overran = f"{deployment_name}-e1"
    driver.move(
        "committing",
        "rolled_back",
        "over the downtime budget",
        downtime_ms=7.4,
        downtime={"downtime_ms": 7.4, "per_engine_ms": {overran: 7.4}},
        error={
            "phase": "committing",
            "engine_id": overran,
            "type": "downtime-budget-exceeded",
            "message": f"engine {overran} was stopped 7.4 ms in its warm_up (budget 5 ms); every engine "
            "resumed generation 1",
            "overrun": {"engine_id": overran, "part": "warm_up", "stopped_ms": 7.4, "budget_ms": 5},
        },
    )
    driver.close()
    shown = epctl(coordinator, "jobs", "show", job_id, "--no-log")
    assert shown.exit_code == 0, shown.output
    assert "rolled_back" in shown.stdout and "downtime-budget-exceeded" in shown.stdout
    assert f"over budget: engine {overran}, part warm_up (stopped 7.4 ms of a 5 ms budget)" in shown.stdout
