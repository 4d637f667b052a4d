"""Asking an agent zygote (`engine_agent/zygote.py`) to fork an agent, instead of a fresh interpreter.

`ForkedProcess` has the part of `subprocess.Popen`'s interface a launcher uses (pid, poll, wait,
signals). The forked agent is the zygote's child, not ours: its exit status comes from the zygote.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine_agent.pids import pid_exists

ASK_TIMEOUT_S = 30.0


def ask(socket_path: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """One request, one answer. OSError when no zygote answers on `socket_path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(ASK_TIMEOUT_S)
        connection.connect(socket_path)
        connection.sendall(json.dumps(request).encode() + b"\n")
        line = connection.makefile("rb").readline()
    if not line:
        raise ConnectionError(f"the agent zygote on {socket_path} closed without an answer")
    answer: dict[str, Any] = json.loads(line)
    return answer


class ForkedProcess:
    """An agent the zygote on `socket_path` forked."""

    def __init__(self, socket_path: str, pid: int, args: Sequence[str]) -> None:
        self.socket_path = socket_path
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                code = ask(self.socket_path, {"op": "status", "pid": self.pid})["returncode"]
            except OSError:  # the zygote is gone (its children live on): ask the process itself
                code = None if pid_exists(self.pid) else -1
            self.returncode = None if code is None else int(code)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def current_umask() -> int:
    """This process's umask, read without changing it (procfs); else set and put back."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        lines = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in lines if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def spawn(
    socket_path: str,
    args: Sequence[str],
    *,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
) -> ForkedProcess:
    """Fork an agent running `epctl-agent args` (shown as `argv`) with this environment, working
    directory and log (appended). OSError when no zygote answers: start a fresh interpreter instead."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.touch()  # created here, so it has our mode, as a fresh interpreter's log would
    request = {
        "op": "spawn",
        "umask": current_umask(),  # what the agent writes (its ready file) is as private as ours
        "args": list(args),
        "argv": list(argv),
        "env": dict(env),
        "cwd": str(cwd),
        "log": str(log_path),
    }
    return ForkedProcess(socket_path, int(ask(socket_path, request)["pid"]), argv)
