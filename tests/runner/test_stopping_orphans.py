"""An engine whose starter is gone (a coordinator stopped or killed before its engines) is another
process's child: once it exits it is a zombie until that parent reaps it, and an init may reap late or
never (this machine's reaps about every 2 s). The launchers' `is_alive` counts a zombie as gone, so a
stop (`stop_pid`) returns once the engine has exited instead of running to its grace and a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from app.launchers.local import stop_pid
from app.launchers.processes import is_alive, is_zombie

# A parent that starts a child and never reaps it, as an absent starter's engine has.
NEGLECTFUL_PARENT = """
import subprocess, sys, time
child = subprocess.Popen(["sleep", "600"])
print(child.pid, flush=True)
time.sleep(600)
"""

pytestmark = pytest.mark.processes  # a parent and its child


def test_an_exited_engine_of_another_parent_counts_as_gone_and_its_stop_does_not_wait_for_the_reap() -> None:
    parent = subprocess.Popen([sys.executable, "-c", NEGLECTFUL_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert is_alive(child) and not is_zombie(child)
        assert stop_pid(child) is True  # it was running
        # Exited, and its parent has not reaped it: kill(0) still finds it, yet it is gone.
        assert is_zombie(child)
        assert not is_alive(child)
        assert not is_alive(child)  # asking again reaps nothing of ours and changes nothing
    finally:
        parent.kill()
        parent.wait()
    assert not is_zombie(os.getpid()) and is_alive(os.getpid())


def test_a_process_that_ignores_sigterm_is_alive_until_killed() -> None:
    """A live process is not mistaken for a zombie: one that ignores SIGTERM keeps running through it."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)"
    code += "; time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGTERM)
        assert is_alive(child.pid) and not is_zombie(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not is_alive(child.pid)
