"""One coordinator per data directory: an fcntl lock on `<state dir>/coordinator.lock`.

The local launcher's state (the pid record of the agents it started, their logs, their token) lives in
the data directory; two coordinators driving it at once stop each other's engines and rewrite each
other's deployments. The lock is taken before anything is touched (no migration, no token, no agent
stopped), held for the life of the process (the kernel lets it go when the process dies, even by
SIGKILL) and taken again by the same process for free (`epctl up` holds it before its app starts).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

LOCK_FILE = "coordinator.lock"

_held: dict[Path, int] = {}  # resolved directory -> the open file descriptor holding its lock


class DataDirInUseError(Exception):
    """Another live process holds the data directory."""

    def __init__(self, state_dir: Path, holder: str) -> None:
        super().__init__(
            f"data directory {state_dir} is in use by another coordinator ({holder}); stop it first, "
            "or give this one another directory (--data-dir / EPCTL_DATA_DIR)"
        )
        self.state_dir = state_dir
        self.holder = holder


def hold_state_dir(state_dir: Path, *, holder: str) -> Path:
    """Lock `state_dir` for this process (idempotent), or raise `DataDirInUseError` without changing
    anything in it. Returns the resolved directory."""
    directory = Path(state_dir).resolve()
    if directory in _held:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            described = os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown process"
        finally:
            os.close(fd)
        raise DataDirInUseError(directory, described) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{holder}, pid {os.getpid()} on {socket.gethostname()} since {time.ctime()}\n".encode(), 0)
    _held[directory] = fd
    return directory


def holds_state_dir(state_dir: Path) -> bool:
    """Whether this process holds the lock of `state_dir`."""
    return Path(state_dir).resolve() in _held
