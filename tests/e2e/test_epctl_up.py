"""`epctl up` is the main job: coordinator on SQLite plus two local engines; Ctrl-C leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app.launchers.local import PIDS_FILE
from tests.e2e.harness import free_port


def epctl() -> list[str]:
    script = Path(sys.executable).with_name("epctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "app.cli.main"]


def test_epctl_up_serves_two_engines_prints_a_token_and_ctrl_c_stops_every_agent(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPCTL_", "DATABASE_URL"))}
    env["EPCTL_RUNNER_LOCAL_AGENT_ARGS"] = "--heartbeat-s 1"
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*epctl(), "up", "--port", str(port), "--data-dir", str(tmp_path / "data")],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    pids: list[int] = []
    try:
        give_up = time.monotonic() + 90
        while "export EPCTL_TOKEN=" not in log_path.read_text():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < give_up, log_path.read_text()
            time.sleep(0.2)
        output = log_path.read_text()
        token = output.split("export EPCTL_TOKEN=")[1].split()[0]
        assert f"http://127.0.0.1:{port}" in output and "target_dp_size" in output

        headers = {"Authorization": f"Bearer {token}"}
        deployment = httpx.get(f"http://127.0.0.1:{port}/v1/deployments/demo", headers=headers).json()
        assert deployment["current_dp_size"] == 2 and deployment["launcher"] == "local"
        records = json.loads((tmp_path / "data" / PIDS_FILE).read_text())
        pids = [entry["pid"] for entry in records.values()]
        assert len(pids) == 2

        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        assert all(not Path(f"/proc/{pid}").exists() for pid in pids), "agent processes outlived epctl up"
        assert json.loads((tmp_path / "data" / PIDS_FILE).read_text()) == {}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        for pid in pids:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
