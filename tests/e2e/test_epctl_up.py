"""`epctl up` is the main job: coordinator on SQLite plus two local engines; Ctrl-C leaves nothing."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import httpx

from app.launchers.local import PIDS_FILE
from tests.support.processes import clean_environment, epctl_command, free_port, spawn


def test_epctl_up_serves_two_engines_prints_a_token_and_ctrl_c_stops_every_agent(tmp_path: Path) -> None:
    port = free_port()
    env = clean_environment({"EPCTL_RUNNER_LOCAL_AGENT_ARGS": "--heartbeat-s 1"})
    argv = [*epctl_command(), "up", "--port", str(port), "--data-dir", str(tmp_path / "data")]
    up = spawn("epctl up", argv, tmp_path / "up.log", env=env, cwd=tmp_path)
    pids: list[int] = []

    def welcome() -> str | None:
        text = up.log_path.read_text()
        return text if "export EPCTL_TOKEN=" in text else None

    try:
        output = up.wait_for(welcome, timeout_s=90, what="epctl up to print the token")
        token = output.split("export EPCTL_TOKEN=")[1].split()[0]
        assert f"http://127.0.0.1:{port}" in output and "target_dp_size" in output
        # One admin token on a first start, printed once, and kept for the next `epctl up`.
        assert set(re.findall(r"epctl_[A-Za-z0-9_-]{40,}", output)) == {token}, output
        assert (tmp_path / "data" / "admin-token").read_text().strip() == token

        headers = {"Authorization": f"Bearer {token}"}
        deployment = httpx.get(f"http://127.0.0.1:{port}/v1/deployments/demo", headers=headers).json()
        assert deployment["current_dp_size"] == 2 and deployment["launcher"] == "local"
        records = json.loads((tmp_path / "data" / PIDS_FILE).read_text())
        pids = [entry["pid"] for entry in records.values()]
        assert len(pids) == 2
        # Everything it wrote (the database and its -wal/-shm, token files, pid records, agent logs and
        # ready files) is the user's alone.
        written = list((tmp_path / "data").rglob("*"))
        assert any(path.name == "epctl.db" for path in written) and any(p.suffix == ".log" for p in written)
        loose = {
            str(path): oct(path.stat().st_mode & 0o777)
            for path in written
            if path.stat().st_mode & 0o077 and not path.is_symlink()
        }
        assert loose == {}, loose

        up.popen.send_signal(signal.SIGINT)
        up.popen.wait(timeout=30)
        assert all(not Path(f"/proc/{pid}").exists() for pid in pids), "agent processes outlived epctl up"
        assert json.loads((tmp_path / "data" / PIDS_FILE).read_text()) == {}
    finally:
        up.kill()
        for pid in pids:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
