"""`epctl scale ... --wait` against a running local deployment of real reference engines, as a user runs
it: `epctl up` (coordinator on SQLite + deployment `demo` of two locally launched agents) in one
process, the installed `epctl` console script in another.

Select it with `-m agents` (or leave it out with `-m "not agents"`): it starts agent processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.cli.client import fmt_ms
from tests.cli.support import ADMIN_TOKEN, ROOT, free_port

EPCTL = ROOT / ".venv" / "bin" / "epctl"

pytestmark = pytest.mark.agents


@dataclass
class LocalDemo:
    url: str
    api: httpx.Client
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def local_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDemo]:
    """`epctl up` on a free port with its own data directory, once `demo` serves on two engines."""
    data_dir = tmp_path_factory.mktemp("epctl-up")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPCTL_") and k != "DATABASE_URL"}
    env["EPCTL_ADMIN_TOKEN"] = ADMIN_TOKEN
    log_path = data_dir / "epctl-up.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(EPCTL), "up", "--port", str(port), "--data-dir", str(data_dir)],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    demo = LocalDemo(f"http://127.0.0.1:{port}",
                     httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0,
                                  headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}),
                     log_path)
    try:
        _wait_for_demo(process, demo)
        yield demo
    finally:
        demo.api.close()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # Ctrl-C: `epctl up` stops its agents
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        from app.launchers.local import LocalLauncher

        LocalLauncher(data_dir).stop_all()  # whatever a failed shutdown left behind


def _wait_for_demo(process: subprocess.Popen[bytes], demo: LocalDemo, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"epctl up exited with {process.returncode}:\n{demo.log()}")
        try:
            response = demo.api.get("/v1/deployments/demo")
            if response.status_code == 200 and response.json()["current_dp_size"] == 2:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"demo not serving on 2 engines after {timeout_s}s:\n{demo.log()}")


def run_epctl(demo: LocalDemo, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EPCTL_URL": demo.url, "EPCTL_TOKEN": ADMIN_TOKEN}
    return subprocess.run([str(EPCTL), *args], env=env, capture_output=True, text=True, timeout=180,
                          check=False)


def test_scale_wait_follows_real_agents_to_success_and_reports_the_downtime(local_demo: LocalDemo) -> None:
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
    completed = run_epctl(local_demo, "scale", "demo", "2", "--wait", "--json", "--timeout", "150")
    assert completed.returncode == 0, completed.stdout + completed.stderr + local_demo.log()
    job = json.loads(completed.stdout)
    assert (job["state"], job["to_dp_size"]) == ("succeeded", 2)
    assert set(job["phases"]) >= {"preparing", "syncing", "committing", "cleaning_up"}
