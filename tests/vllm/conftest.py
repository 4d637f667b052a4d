"""Fixtures of the vLLM backend's tests.

The real vLLM server and the stand-in run in the vLLM venv (`.venv-vllm`, made by `scripts/vllm-env`,
which `scripts/test` runs). Without it those tests skip, saying so; the API and unit tests here run
anyway. Coordinators are real uvicorn processes with the job runner on (`tests/support/stack.py`, on the
harness of `tests/support/processes.py`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import ROOT, free_port, spawn
from tests.support.stack import StackCoordinator

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SCRIPTS = Path(__file__).resolve().parent


def vllm_venv_missing() -> str | None:
    if not VLLM_PYTHON.exists():
        return f"the vLLM venv is missing ({VLLM_PYTHON}): run scripts/vllm-env (scripts/test does)"
    if not (VLLM_PYTHON.parent.parent / ".ready").exists():
        return "the vLLM venv is incomplete (its build did not finish): run scripts/vllm-env again"
    return None


@pytest.fixture(scope="session")
def vllm_python() -> str:
    reason = vllm_venv_missing()
    if reason is not None:
        pytest.skip(reason)
    return str(VLLM_PYTHON)


@pytest.fixture(scope="session")
def tiny_model(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Mixtral-style MoE with random weights (fixed seed) and a locally trained tokenizer."""
    out = tmp_path_factory.mktemp("tiny-moe")
    result = subprocess.run(
        [vllm_python, str(SCRIPTS / "make_tiny_model.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def vllm_env(**overrides: str) -> dict[str, str]:
    """The coordinator's vLLM settings in these tests: short deadlines, dense canaries."""
    env = {
        "EPCTL_VLLM_PYTHON": str(VLLM_PYTHON),
        "EPCTL_VLLM_CALL_TIMEOUT_S": "5",
        "EPCTL_VLLM_BASELINE_S": "1.5",
        "EPCTL_VLLM_SCALE_DEADLINE_S": "6",
        "EPCTL_VLLM_VERIFY_DEADLINE_S": "20",
        "EPCTL_VLLM_SETTLE_S": "2",
        "EPCTL_VLLM_CANARY_INTERVAL_S": "0.05",
        "EPCTL_VLLM_READY_TIMEOUT_S": "400",
    }
    env.update(overrides)
    return env


def run_job(coordinator: StackCoordinator, deployment: str, target: int, **fields: Any) -> dict[str, Any]:
    """Ask for `target` and wait for the job to end."""
    return coordinator.wait_job(coordinator.scale(target, deployment, **fields), timeout_s=120)


def event_kinds(job: dict[str, Any]) -> list[str]:
    return [e["kind"] for e in job["events"]]


def progress_steps(job: dict[str, Any]) -> list[str]:
    return [e["message"] for e in job["events"] if e["kind"] == "progress"]


def start_coordinator(database_url: str, data_dir: Path, **env: str) -> StackCoordinator:
    coordinator = StackCoordinator(database_url, data_dir, env=vllm_env(**env))
    coordinator.api.timeout = httpx.Timeout(30.0)
    return coordinator.start()


class StandIn:
    """The stand-in vLLM server (`standin_server.py`): vLLM's own elastic EP route and 503 middleware
    over a stand-in engine client, in its own process."""

    def __init__(self, python: str, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        argv = [python, str(SCRIPTS / "standin_server.py"), "--port", str(self.port)]
        self.child = spawn("vLLM stand-in", argv, log_path, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
        self.child.wait_for(  # importing vLLM's route pulls in torch and transformers
            lambda: httpx.get(f"{self.url}/standin/state", timeout=2).status_code == 200,
            timeout_s=240,
            what="the stand-in to serve",
        )

    def control(self, action: str, **body: Any) -> dict[str, Any]:
        response = httpx.post(f"{self.url}/standin/{action}", json=body, timeout=10)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def reset(self, **body: Any) -> dict[str, Any]:
        """No change running, not wedged, the given outcome (default success), DP size 1."""
        self.control("reset")
        return self.control("configure", **{"outcome": "success", "dp_size": 1, "metrics_dp_size": 1, **body})

    def state(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/standin/state", timeout=10).json())

    def close(self) -> None:
        self.child.stop()


@pytest.fixture(scope="module")
def standin(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    server = StandIn(vllm_python, tmp_path_factory.mktemp("standin") / "standin.log")
    try:
        yield server
    finally:
        server.close()
