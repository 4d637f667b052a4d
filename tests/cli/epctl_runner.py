"""Running `epctl` in-process against a coordinator process (typer's runner, the coordinator's URL and
token in the environment), and the small helpers the CLI tests share."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import httpx
from typer.testing import CliRunner, Result

from app.cli.main import app as cli_app
from tests.support.processes import Coordinator
from tests.support.waiting import wait_until

runner = CliRunner()


def epctl(coordinator: Coordinator, *args: str, token: str | None = None) -> Result:
    env = {"EPCTL_URL": coordinator.url, "EPCTL_TOKEN": token or coordinator.admin_token}
    return runner.invoke(cli_app, list(args), env=env)


def scale_job_id(coordinator: Coordinator, deployment: str, target: int) -> str:
    result = epctl(coordinator, "scale", deployment, str(target), "--json")
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["id"])


def engine_ids(deployment: str, count: int = 3) -> list[str]:
    return [f"{deployment}-e{i}" for i in range(count)]


def active_job_id(api: httpx.Client, deployment: str, timeout_s: float = 10.0) -> str:
    job_id = wait_until(
        lambda: api.get(f"/v1/deployments/{deployment}").json().get("active_job_id"),
        timeout_s=timeout_s,
        what=f"an active job on {deployment}",
    )
    return str(job_id)


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
