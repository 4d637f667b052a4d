"""`launcher: ray` deployments: their Ray settings validated (422 problem+json), stored, shown, updated;
and the coordinator never imports Ray for them."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.processes import ROOT

FULL: dict[str, Any] = {
    "address": "127.0.0.1:6379",
    "namespace": "serving-prod",
    "num_cpus": 2,
    "num_gpus": 1,
    "memory_mb": 4096,
    "resources": {"accelerator_h200": 1},
    "placement_strategy": "SPREAD",
    "placement_timeout_s": 30,
    "runtime_env": {
        "working_dir": "s3://bucket/epctl.zip",
        "env_vars": {"OMP_NUM_THREADS": "4"},
        "pip": None,
    },
    "agent_host": "10.0.0.5",
}


def ray_deployment(name: str = "big", **ray: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "launcher": "ray", "min_dp_size": 1, "max_dp_size": 32}
    if ray:
        body["ray"] = ray
    return body


def test_a_ray_deployment_without_settings_gets_the_defaults(client: TestClient) -> None:
    response = client.post("/v1/deployments", json=ray_deployment())
    assert response.status_code == 201, response.text
    ray = response.json()["ray"]
    assert (ray["namespace"], ray["num_cpus"], ray["num_gpus"], ray["placement_strategy"]) == (
        "epctl",
        1.0,
        0.0,
        "PACK",
    )
    assert ray["address"] is None and ray["resources"] == {}


def test_ray_settings_are_stored_and_shown(client: TestClient) -> None:
    assert client.post("/v1/deployments", json=ray_deployment(**FULL)).status_code == 201
    shown = client.get("/v1/deployments/big").json()
    assert shown["launcher"] == "ray"
    ray = shown["ray"]
    for key, value in FULL.items():
        assert ray[key] == value, key
    listed = client.get("/v1/deployments").json()["data"][0]
    assert listed["ray"] == ray


def test_other_launchers_show_no_ray_settings(client: TestClient) -> None:
    client.post("/v1/deployments", json={"name": "plain"})
    assert client.get("/v1/deployments/plain").json()["ray"] is None


@pytest.mark.parametrize(
    "ray",
    [
        {"num_cpus": -1},
        {"num_gpus": 1.5},
        {"num_cpus": 0},  # reserves nothing: Ray refuses an empty bundle
        {"placement_strategy": "DIAGONAL"},
        {"resources": {"CPU": 2}},
        {"resources": {"accel": 0}},
        {"resources": {"bad name!": 1}},
        {"num_cpu": 2},
        {"address": "not an address"},
        {"namespace": "has spaces"},
        {"placement_timeout_s": 0},
        {"runtime_env": {"conda": "env"}},
        {"runtime_env": {"working_dir": "/srv/local/dir"}},  # Ray uploads local dirs per job only
        {"runtime_env": {"env_vars": {"EPCTL_TOKEN": "x"}}},
        {"runtime_env": {"env_vars": {"1BAD": "x"}}},
    ],
    ids=lambda r: "-".join(f"{k}" for k in r),
)
def test_bad_ray_settings_are_422_problems_and_create_nothing(
    client: TestClient, ray: dict[str, Any]
) -> None:
    response = client.post("/v1/deployments", json=ray_deployment(**ray))
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/deployments").json()["count"] == 0


def test_ray_settings_on_another_launcher_are_422(client: TestClient) -> None:
    response = client.post("/v1/deployments", json={"name": "x", "launcher": "local", "ray": {"num_cpus": 1}})
    assert response.status_code == 422
    assert "launcher ray" in response.text


def test_update_replaces_the_ray_settings(client: TestClient) -> None:
    client.post("/v1/deployments", json=ray_deployment())
    response = client.patch("/v1/deployments/big", json={"ray": {"num_cpus": 4, "resources": {"accel": 2}}})
    assert response.status_code == 200, response.text
    ray = response.json()["ray"]
    assert (ray["num_cpus"], ray["resources"]) == (4.0, {"accel": 2.0})


def test_update_of_ray_settings_on_a_local_deployment_is_422(client: TestClient) -> None:
    client.post("/v1/deployments", json={"name": "plain"})
    response = client.patch("/v1/deployments/plain", json={"ray": {"num_cpus": 2}})
    assert response.status_code == 422 and response.json()["code"] == "launcher-mismatch"


def test_moving_a_deployments_engines_to_another_cluster_waits_until_none_run(client: TestClient) -> None:
    client.post("/v1/deployments", json=ray_deployment())
    registration = {
        "engine_id": "big-0000abcd-0",
        "deployment": "big",
        "url": "http://127.0.0.1:9/x",
        "platform": "cpu",
        "device": "cpu",
        "engine": {},
    }
    assert client.post("/v1/engines", json=registration).status_code in (200, 201)
    moved = client.patch("/v1/deployments/big", json={"ray": {"address": "10.0.0.1:6379"}})
    assert moved.status_code == 409 and moved.json()["code"] == "ray-engines-running"
    assert client.get("/v1/deployments/big").json()["ray"]["address"] is None
    resized = client.patch("/v1/deployments/big", json={"ray": {"num_cpus": 2}})
    assert resized.status_code == 200  # resources apply to the next launch: allowed any time


@pytest.mark.processes
def test_the_coordinator_never_imports_ray_by_itself() -> None:
    """Importing the app (and the Ray launcher's module) leaves `ray` unloaded: it is imported on the
    first launch or release of a `launcher: ray` deployment only."""
    code = (
        "import sys, app.main, app.launchers.ray_launcher, app.launchers.registry\n"
        "loaded = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
