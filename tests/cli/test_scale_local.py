"""`epctl scale ... --wait` against a running local deployment of real reference engines, as a user runs
it: `epctl up` (coordinator on SQLite + deployment `demo` of two locally launched agents) in one
process, the installed `epctl` console script in another.

Select it with `-m agents` (or leave it out with `-m "not agents"`): it starts agent processes.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from app.cli.client import fmt_ms
from tests.support.jobs import bring_to_size
from tests.support.processes import (
    ADMIN_TOKEN,
    ROOT,
    Child,
    clean_environment,
    epctl_command,
    free_port,
    spawn,
    stop_local_agents,
)

pytestmark = pytest.mark.agents


@dataclass
class LocalDemo:
    url: str
    api: httpx.Client
    up: Child

    def log(self) -> str:
        return self.up.log_tail()


@pytest.fixture(scope="module")
def local_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDemo]:
    """`epctl up` on a free port with its own data directory, once `demo` serves on two engines."""
    data_dir = tmp_path_factory.mktemp("epctl-up")
    port = free_port()
    argv = [*epctl_command(), "up", "--port", str(port), "--data-dir", str(data_dir)]
    up = spawn(
        "epctl up", argv, data_dir / "epctl-up.log", env=clean_environment({"EPCTL_ADMIN_TOKEN": ADMIN_TOKEN})
    )
    url = f"http://127.0.0.1:{port}"
    api = httpx.Client(base_url=url, timeout=10.0, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    try:
        up.wait_for(
            lambda: api.get("/v1/deployments/demo").json().get("current_dp_size") == 2,
            timeout_s=120,
            what="epctl up to serve demo on 2 engines",
        )
        yield LocalDemo(url, api, up)
    finally:
        api.close()
        up.interrupt()  # Ctrl-C: `epctl up` stops its agents
        stop_local_agents(data_dir)  # whatever a failed shutdown left behind


def demo_at(demo: LocalDemo, size: int) -> LocalDemo:
    bring_to_size(demo.api, "demo", size, timeout_s=150)
    return demo


def run_epctl(demo: LocalDemo, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EPCTL_URL": demo.url, "EPCTL_TOKEN": ADMIN_TOKEN}
    return subprocess.run(
        [*epctl_command(), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_scale_wait_follows_real_agents_to_success_and_reports_the_downtime(local_demo: LocalDemo) -> None:
    demo_at(local_demo, 2)
    completed = run_epctl(local_demo, "scale", "demo", "3", "--wait", "--timeout", "150")
    assert completed.returncode == 0, completed.stdout + completed.stderr + local_demo.log()
    latest = local_demo.api.get("/v1/reconfigurations", params={"deployment": "demo", "limit": 1})
    job = latest.json()["data"][0]
    assert (job["state"], job["to_dp_size"], job["requested_by"]) == ("succeeded", 3, "cli")
    assert job["downtime_ms"] > 0
    out = completed.stdout
    assert f"Job {job['id']} succeeded" in out
    assert f"downtime: {fmt_ms(job['downtime_ms'])}" in out
    for result in job["engine_results"]:
        assert result["engine_id"] in out
    assert local_demo.api.get("/v1/deployments/demo").json()["current_dp_size"] == 3


def test_scale_wait_json_back_down_prints_the_finished_job(local_demo: LocalDemo) -> None:
    demo_at(local_demo, 3)
    completed = run_epctl(local_demo, "scale", "demo", "2", "--wait", "--json", "--timeout", "150")
    assert completed.returncode == 0, completed.stdout + completed.stderr + local_demo.log()
    job = json.loads(completed.stdout)
    assert (job["state"], job["to_dp_size"]) == ("succeeded", 2)
    assert set(job["phases"]) >= {"preparing", "syncing", "committing", "cleaning_up"}
