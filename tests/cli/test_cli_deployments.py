"""`epctl deployments` and `epctl engines` against a real coordinator process (uvicorn, SQLite file):
create, list, show, update (Ray settings too), delete; `--json` prints the API's document."""

from __future__ import annotations

import json

import httpx

from tests.cli.epctl_runner import epctl
from tests.support.job_driver import create_static_deployment
from tests.support.processes import Coordinator


def test_deployments_create_then_list_shows_it(coordinator: Coordinator, deployment_name: str) -> None:
    created = epctl(
        coordinator,
        "deployments",
        "create",
        deployment_name,
        "--min",
        "1",
        "--max",
        "4",
        "--launcher",
        "static",
        "--warmup-policy",
        "deferred",
    )
    assert created.exit_code == 0, created.output
    listed = epctl(coordinator, "deployments", "list")
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.stdout.splitlines() if line.startswith(deployment_name))
    assert "1..4" in row and "deferred" in row and "static" in row


def test_ray_settings_are_given_shown_and_updated_from_the_cli(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    created = epctl(
        coordinator,
        "deployments",
        "create",
        deployment_name,
        "--launcher",
        "ray",
        "--ray",
        "address=127.0.0.1:6379",
        "--ray",
        "num_gpus=1",
        "--ray",
        "placement_strategy=SPREAD",
        "--ray",
        "resources.accel=2",
        "--ray",
        "runtime_env.env_vars.OMP_NUM_THREADS=4",
    )
    assert created.exit_code == 0, created.output
    assert "ray: address=127.0.0.1:6379" in created.stdout and "placement_strategy=SPREAD" in created.stdout
    ray = api.get(f"/v1/deployments/{deployment_name}").json()["ray"]
    assert (ray["num_gpus"], ray["resources"], ray["runtime_env"]["env_vars"]) == (
        1.0,
        {"accel": 2.0},
        {"OMP_NUM_THREADS": "4"},  # environment values stay strings
    )
    updated = epctl(coordinator, "deployments", "update", deployment_name, "--ray", "num_cpus=4", "--json")
    assert updated.exit_code == 0, updated.output
    ray = json.loads(updated.stdout)["ray"]
    assert (ray["num_cpus"], ray["num_gpus"], ray["placement_strategy"]) == (4.0, 1.0, "SPREAD")  # merged
    refused = epctl(coordinator, "deployments", "update", deployment_name, "--ray", "num_cpus=-1")
    assert refused.exit_code == 1 and "num_cpus" in refused.output


def test_json_flag_prints_the_api_document(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=2)
    result = epctl(coordinator, "deployments", "show", deployment_name, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == deployment_name


def test_deployments_update_changes_only_the_given_fields(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=2)
    result = epctl(coordinator, "deployments", "update", deployment_name, "--max", "6", "--json")
    assert result.exit_code == 0, result.output
    updated = json.loads(result.stdout)
    assert (updated["min_dp_size"], updated["max_dp_size"]) == (1, 6)


def test_deployments_delete_removes_an_idle_deployment(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=0)
    result = epctl(coordinator, "deployments", "delete", deployment_name, "--yes")
    assert result.exit_code == 0, result.output
    assert api.get(f"/v1/deployments/{deployment_name}").status_code == 404


def test_engines_list_shows_registered_engines(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=3)
    result = epctl(coordinator, "engines", "list", "--deployment", deployment_name)
    assert result.exit_code == 0, result.output
    engine_lines = [line for line in result.stdout.splitlines() if line.startswith(f"{deployment_name}-e")]
    assert len(engine_lines) == 3


def test_autoscaling_behaviour_and_pause_are_set_shown_and_updated_from_the_cli(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    created = epctl(
        coordinator,
        "deployments",
        "create",
        deployment_name,
        "--launcher",
        "static",
        "--scale-down-window",
        "120",
        "--scale-up-max-step",
        "2",
        "--pause-autoscaling",
    )
    assert created.exit_code == 0, created.output
    assert "autoscaling: paused" in created.stdout and "window 120 s" in created.stdout
    resumed = epctl(
        coordinator,
        "deployments",
        "update",
        deployment_name,
        "--resume-autoscaling",
        "--scale-up-max-step",
        "0",
    )
    assert resumed.exit_code == 0, resumed.output
    shown = api.get(f"/v1/deployments/{deployment_name}").json()
    assert shown["autoscale_paused"] is False
    assert shown["autoscale_behavior"]["scale_down"]["stabilization_window_s"] == 120
    assert shown["autoscale_behavior"]["scale_up"]["max_step"] is None
