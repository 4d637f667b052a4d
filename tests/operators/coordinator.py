"""A real coordinator process (uvicorn) on a free loopback port and a given database: for the tests
that need a live server (SSE streams, a SIGKILL between a transition and its webhook delivery).
The job runner is off: tests move jobs with the state machine's own function against the same database.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.fixtures import ADMIN_TOKEN

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Coordinator:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, timeout=10.0, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown, no cleanup, exactly like a crash."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@contextmanager
def coordinator(database_url: str, work_dir: Path, **env: str) -> Iterator[Coordinator]:
    """Start `uvicorn app.main:app` on `database_url`, wait for /readyz; always stop it afterwards."""
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EPCTL_") and k != "DATABASE_URL"}
    environment.update(
        DATABASE_URL=database_url,
        EPCTL_DATA_DIR=str(work_dir / "data"),
        EPCTL_ADMIN_TOKEN=ADMIN_TOKEN,
        EPCTL_RUNNER_ENABLED="false",
        PYTHONUNBUFFERED="1",
        **env,
    )
    log_path = work_dir / f"coordinator-{port}.log"
    command = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--log-level", "warning"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Coordinator(f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_ready(running)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                running.kill()


def _wait_ready(running: Coordinator, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise RuntimeError(f"coordinator exited with {running.process.returncode}:\n{running.log()}")
        try:
            if httpx.get(f"{running.url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"coordinator not ready in {timeout_s} s:\n{running.log()}")
