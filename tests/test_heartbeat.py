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
