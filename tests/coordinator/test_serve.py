"""`epctl serve` as a user runs it: a real process on a free port with a fresh SQLite file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

EPCTL = str(Path(sys.executable).with_name("epctl"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_migrates_prints_the_first_admin_token_and_answers(tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "EPCTL_ADMIN_TOKEN")}
    process = subprocess.Popen(
        [EPCTL, "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "epctl serve did not become ready"
            time.sleep(0.1)
        assert (tmp_path / ".data" / "epctl.db").exists()
        assert httpx.get(f"{base}/v1/deployments").status_code == 401
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
    secret = next(word for word in stderr.split() if word.startswith("epctl_"))
    assert "created an admin token" in stderr and len(secret) > 30
