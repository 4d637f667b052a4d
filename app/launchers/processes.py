"""Child processes a launcher starts on this machine, and the record that outlives the coordinator.

Both local launchers (the agents' and the vLLM servers') start their children the same way: in a
session of their own (a signal to the coordinator's terminal does not reach them; they are stopped
explicitly), standard input closed, output appended to a log file. Each keeps a JSON record of what it
started (pid, log, url...) in its state directory, written atomically, so a coordinator restarted after
a crash can still stop what its predecessor left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine_agent.pids import pid_exists


def start_detached(
    command: Sequence[str], *, env: Mapping[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """Start `command` in its own session, stdin closed, stdout and stderr appended to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(command),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives a coordinator crash; stopped explicitly
        )


def is_alive(pid: int) -> bool:
    """Whether `pid` runs. A zombie has exited and counts as gone: one of ours is reaped here; another's
    is left to its parent (an engine whose coordinator is gone is init's child, and an init may reap
    late or never: waiting for that made each such stop run to its grace)."""
    if not pid_exists(pid):
        return False
    # A zombie child still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return not is_zombie(pid)


def is_zombie(pid: int) -> bool:
    """Exited, not yet reaped, as /proc says (False where it cannot say: no procfs, or gone since)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][:1] == "Z"
    except (OSError, IndexError):
        return False


class ProcessRecords:
    """A JSON file of what a launcher started, one entry by name (an engine id, a deployment)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, dict[str, Any]]:
        """Every entry; {} when the file is missing or unreadable."""
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def set(self, name: str, entry: dict[str, Any] | None) -> None:
        """Record `entry` under `name`, or forget `name` (None). Written through a temporary file, so a
        crash never leaves half a record, under an exclusive lock: the coordinator and a CLI or a second
        launcher in another process write the same file (two writers sharing one temporary name lost
        each other's entries, or found it renamed away: FileNotFoundError in CI)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            records = self.read()
            if entry is None:
                records.pop(name, None)
            else:
                records[name] = entry
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(records, indent=2, sort_keys=True))
            tmp.replace(self.path)
