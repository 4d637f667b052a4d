"""Files the coordinator writes are its own: the SQLite database (and its -wal, -shm, -journal), the
admin-token and agent-token files, the local launcher's pid records, ready files and agent logs, all
readable and writable by the coordinator's user only (0600; folders 0700)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_UMASK = 0o077
PRIVATE_FILE_MODE = 0o600
SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


def keep_new_files_private() -> None:
    """From now on every file this process (and the agents it starts) creates is 0600, every folder
    0700: the umask of a process that owns its process (`epctl serve`, `epctl up`, `uvicorn app.main:app`)."""
    os.umask(os.umask(PRIVATE_UMASK) | PRIVATE_UMASK)


def private_sqlite_file(path: Path) -> None:
    """Create the database file 0600 before SQLite opens it (its -wal and -shm take its mode), and make
    an existing one and its companions 0600 (a file an older version left readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE))
    for suffix in SQLITE_COMPANIONS:
        companion = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if companion.stat().st_mode & 0o777 != PRIVATE_FILE_MODE:
                companion.chmod(PRIVATE_FILE_MODE)
