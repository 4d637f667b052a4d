"""`epctl serve` as a user runs it: a real process on a free port with a fresh SQLite file."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.support.processes import epctl_command, free_port, spawn


@pytest.mark.processes
def test_serve_migrates_prints_the_first_admin_token_and_answers(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "EPCTL_ADMIN_TOKEN")}
    argv = [*epctl_command(), "serve", "--port", str(port)]
    serve = spawn("epctl serve", argv, tmp_path / "serve.log", env=env, cwd=tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        serve.wait_for(
            lambda: httpx.get(f"{base}/readyz", timeout=1).status_code == 200,
            timeout_s=30,
            what="epctl serve to be ready",
        )
        assert (tmp_path / ".data" / "epctl.db").exists()
        assert httpx.get(f"{base}/v1/deployments").status_code == 401
    finally:
        serve.interrupt(grace_s=15)
    output = serve.log_path.read_text()
    secret = next(word for word in output.split() if word.startswith("epctl_"))
    assert "created an admin token" in output and len(secret) > 30
