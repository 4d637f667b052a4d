"""`python -m engine_agent.zygote SOCKET`: agents forked from one warmed interpreter.

Importing torch and the agent costs a fresh interpreter seconds of CPU (4-13 s on a loaded 2-core
machine); a launcher that starts many agents on one machine (`epctl up`, the test suite) can ask this
process instead: it imports everything once, then forks one agent per request. A forked agent is a
process of its own: its own session, environment, working directory, log and command line (written
over this process's, so `ps` and the launcher's pid check see the engine), and it runs
`engine_agent.main.main(args)` exactly as `epctl-agent` does; only the imports are shared. This parent
runs nothing but imports (no thread, no torch op, no event loop), so a fork is as clean as a fresh start.

One JSON line per connection: {"op": "spawn", "args", "argv", "env", "cwd", "log", "umask"} -> {"pid"};
{"op": "status", "pid"} -> {"returncode"} (null while it runs; this parent reaps its children).
The parent exits once the process that started it is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# Started with this much room in its own command line, so a child's (written over it) fits.
CMDLINE_ROOM = 2048


def serve(path: str) -> None:
    import engine_agent.main  # torch and every module an agent imports, once

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o077)  # the socket is this user's alone: whoever connects may start a process as us
    try:
        listener.bind(path)
    finally:
        os.umask(mask)
    listener.listen(64)
    listener.settimeout(0.05)  # also how soon an exited child is reaped
    exited: dict[int, int] = {}
    parent = os.getppid()
    while os.getppid() == parent:  # the starter gone (even killed): so is this parent
        _reap(exited)
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        with connection:
            connection.settimeout(10)
            request = json.loads(connection.makefile("rb").readline())
            if request["op"] == "spawn":
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    connection.close()
                    _run_agent(request, engine_agent.main.main)
                answer: dict[str, Any] = {"pid": pid}
            else:
                _reap(exited)
                answer = {"returncode": exited.get(int(request["pid"]))}
            connection.sendall(json.dumps(answer).encode() + b"\n")


def _reap(exited: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exited[pid] = os.waitstatus_to_exitcode(status)


def cmdline_bytes(argv: Sequence[str], room: int) -> bytes:
    """`argv` as /proc/PID/cmdline holds it (NUL after each), cut to `room` bytes (the last one a NUL)."""
    data = b"".join(arg.encode(errors="replace") + b"\0" for arg in argv)
    return data if len(data) <= room else data[: room - 1] + b"\0"


def set_cmdline(argv: Sequence[str]) -> bool:
    """Write `argv` over this process's command line (what `ps` and /proc/PID/cmdline show), within
    the room the original one had; False where the platform has no procfs to say where it is."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(") ", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat fields 48 and 49)
    except (OSError, IndexError, ValueError):
        return False
    if end <= start:
        return False
    data = cmdline_bytes(argv, end - start)
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)
    return True


def _run_agent(request: Mapping[str, Any], main: Callable[[list[str]], int | None]) -> None:
    """In the forked child: become the agent process, then leave (never back into the parent's loop)."""
    code: int = 1
    try:
        os.setsid()
        os.umask(int(request.get("umask", 0o022)))
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.close(stdin)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        args = [str(a) for a in request["args"]]
        set_cmdline(request.get("argv") or ["epctl-agent", *args])
        sys.argv = ["epctl-agent", *args]
        code = int(main(args) or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def zygote_command(python: str, socket_path: str) -> list[str]:
    """The command that starts a zygote on `socket_path`, with room for its children's command lines."""
    return [python, "-m", "engine_agent.zygote", socket_path, "#" * CMDLINE_ROOM]


if __name__ == "__main__":
    serve(sys.argv[1])
