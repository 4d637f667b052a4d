"""Whether a process id names a live process: one check for the agent, the launchers and the tests."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """`kill(pid, 0)`: a process we may not signal still exists. A zombie counts (see `is_running`)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_running(pid: int) -> bool:
    """Exists and is not a zombie (killed, not yet reaped by its parent)."""
    if not pid_exists(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return False
