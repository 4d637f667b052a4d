"""How `epctl` fails: a problem answer printed readably (exit 1), a bad token, validation errors naming
the field, an unreachable coordinator (exit 3); the installed console script reads its URL and token
from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
from pathlib import Path

import httpx

from app.cli.main import app as cli_app
from tests.cli.epctl_runner import epctl, runner
from tests.support.job_driver import create_static_deployment
from tests.support.processes import ROOT, Coordinator


def test_problem_answer_is_printed_readably_with_exit_1(coordinator: Coordinator) -> None:
    result = epctl(coordinator, "deployments", "show", "no-such-deployment")
    assert result.exit_code == 1
    assert "Error 404" in result.stderr and "no-such-deployment" in result.stderr


def test_bad_token_is_refused_with_exit_1(coordinator: Coordinator) -> None:
    result = epctl(coordinator, "jobs", "list", token="not-a-real-token-at-all")
    assert result.exit_code == 1
    assert "Error 401" in result.stderr


def test_validation_errors_name_the_field(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=2, max_dp_size=4)
    result = epctl(coordinator, "scale", deployment_name, "9")
    assert result.exit_code == 1
    assert "Error 4" in result.stderr and "9" in result.stderr


def test_unreachable_coordinator_exits_3() -> None:
    result = runner.invoke(cli_app, ["jobs", "list", "--url", "http://127.0.0.1:9", "--token", "x"])
    assert result.exit_code == 3
    assert "cannot reach the coordinator" in result.stderr


def test_installed_console_script_reads_url_and_token_from_the_environment(
    coordinator: Coordinator, api: httpx.Client, deployment_name: str
) -> None:
    create_static_deployment(api, deployment_name, engines=1)
    # Where this interpreter's environment installs console scripts (a fresh clone's .venv/bin; from a
    # worktree, the shared environment's), running this checkout's code as the other children do.
    script = Path(sysconfig.get_path("scripts")) / "epctl"
    assert script.exists(), f"no console script at {script}: is the project installed (scripts/bootstrap)?"
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath,
        "EPCTL_URL": coordinator.url,
        "EPCTL_TOKEN": coordinator.admin_token,
    }
    completed = subprocess.run(
        [str(script), "deployments", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert deployment_name in {d["name"] for d in json.loads(completed.stdout)["data"]}
