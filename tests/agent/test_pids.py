"""The one pid check: live, zombie (killed, not reaped) and gone processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from engine_agent.pids import is_running, pid_exists


@pytest.mark.processes  # a `sleep` child, killed and reaped
def test_a_live_process_a_zombie_and_a_reaped_one() -> None:
    assert pid_exists(os.getpid()) and is_running(os.getpid())
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert pid_exists(child.pid) and is_running(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while is_running(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Killed, not reaped: kill(0) still finds it, /proc says Z.
        assert pid_exists(child.pid) and not is_running(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not pid_exists(child.pid) and not is_running(child.pid)
