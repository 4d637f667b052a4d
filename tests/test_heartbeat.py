"""`scripts/test` is never silent for long: the pytest heartbeat (`tests/support/heartbeat.py`) names a
test that runs past `EPCTL_TEST_HEARTBEAT_S`, on the terminal, even while pytest captures its output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT

SLOW_TEST = """
import time

def test_slow():
    print("captured, not shown")
    time.sleep(2.5)  # the behaviour under test: a test that takes its time
"""


@pytest.mark.processes
def test_a_long_test_is_named_while_it_runs(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(SLOW_TEST)
    env = {**os.environ, "EPCTL_TEST_HEARTBEAT_S": "1", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.support.heartbeat"]
    done = subprocess.run(
        [*argv, "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_slow.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "still running test_slow.py::test_slow" in done.stderr, done.stderr
    assert "captured, not shown" not in done.stdout + done.stderr


LEAVES_A_THREAD = """
import threading

def test_leaves_a_thread_behind():
    threading.Thread(target=threading.Event().wait, name="left-behind").start()  # never set: never ends
"""


@pytest.mark.processes
def test_a_thread_left_behind_costs_the_grace_not_the_run(tmp_path: Path) -> None:
    """The interpreter joins non-daemon threads at exit: one that never ends would hold the README's command
    forever after its verdict. The plugin names it and exits with the session's status."""
    (tmp_path / "test_left.py").write_text(LEAVES_A_THREAD)
    env = {**os.environ, "EPCTL_TEST_EXIT_GRACE_S": "1", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.support.heartbeat"]
    done = subprocess.run(
        [*argv, "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_left.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "has not exited 1 s after the session ended" in done.stderr, done.stderr
    assert "left-behind" in done.stderr or "test_left.py" in done.stderr, done.stderr
