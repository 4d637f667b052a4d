"""`epctl scale ... --wait` against a running local deployment of real reference engines: the installed
console script, a uvicorn coordinator with its job runner on, agents its local launcher starts.

Select it with `-m agents` (or leave it out with `-m "not agents"`): it starts agent processes.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli.client import fmt_ms
from tests.e2e.harness import ADMIN_TOKEN, Coordinator
from tests.support.databases import sqlite_database

EPCTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "epctl"

pytestmark = pytest.mark.agents


@pytest.fixture(scope="module")
def local_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """A coordinator (SQLite) serving deployment `demo` of two locally launched engines."""
    tmp = tmp_path_factory.mktemp("local-demo")
    coordinator = Coordinator(sqlite_database(tmp, migrated=True), tmp / "data")
    try:
        coordinator.start()
        coordinator.create_deployment("demo")
        first = coordinator.wait_job(coordinator.scale(2))
        assert first["state"] == "succeeded", first
        yield coordinator
    finally:
        coordinator.close()


def run_epctl(coordinator: Coordinator, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EPCTL_URL": coordinator.url, "EPCTL_TOKEN": ADMIN_TOKEN}
    return subprocess.run([str(EPCTL), *args], env=env, capture_output=True, text=True, timeout=180,
                          check=False)


def test_scale_wait_follows_real_agents_to_success_and_reports_the_downtime(local_demo: Coordinator) -> None:
    completed = run_epctl(local_demo, "scale", "demo", "3", "--wait", "--timeout", "150")
    assert completed.returncode == 0, completed.stdout + completed.stderr + local_demo.log_tail()
    latest = local_demo.api.get("/v1/reconfigurations", params={"deployment": "demo", "limit": 1})
    job = latest.json()["data"][0]
    assert (job["state"], job["to_dp_size"], job["requested_by"]) == ("succeeded", 3, "cli")
    assert job["downtime_ms"] > 0
    out = completed.stdout
    assert f"Job {job['id']} succeeded" in out
    assert f"downtime: {fmt_ms(job['downtime_ms'])}" in out
    for result in job["engine_results"]:
        assert result["engine_id"] in out
    assert local_demo.deployment()["current_dp_size"] == 3


def test_scale_wait_json_back_down_prints_the_finished_job(local_demo: Coordinator) -> None:
    completed = run_epctl(local_demo, "scale", "demo", "2", "--wait", "--json", "--timeout", "150")
    assert completed.returncode == 0, completed.stdout + completed.stderr + local_demo.log_tail()
    job = json.loads(completed.stdout)
    assert (job["state"], job["to_dp_size"]) == ("succeeded", 2)
    assert set(job["phases"]) >= {"preparing", "syncing", "committing", "cleaning_up"}
