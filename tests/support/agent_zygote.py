"""Agents forked from one warmed interpreter, for the agent tests: torch and the agent's modules are
imported once per test session instead of once per agent (~4-5 s of CPU each on a 2-core machine, and
`tests/agent` starts ~200 agents).

A forked agent is a real process of its own: its own session (process group), environment, working
directory and log, and it runs `engine_agent.main.main(args)` exactly as `python -m engine_agent.main`
does; only the imports are shared. The warmed parent runs nothing but imports (no thread, no torch op,
no event loop), so a fork is as clean as a fresh start. Tests of a fresh interpreter's own start (its
imports, its command line) keep starting real interpreters.

    python -m tests.support.agent_zygote SOCKET     # the parent: imports, then serves the socket

One JSON line per connection: {"op": "spawn", "argv", "env", "cwd", "log"} -> {"pid"};
{"op": "status", "pid"} -> {"returncode"} (null while it runs; the parent reaps its children).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_until

AGENT_MODULE = ["-m", "engine_agent.main"]


# --- the warmed parent --------------------------------------------------------------------------------


def serve(path: str) -> None:
    import engine_agent.main  # torch and every module an agent imports, once

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(0.2)
    exited: dict[int, int] = {}
    parent = os.getppid()
    while os.getppid() == parent:  # pytest gone (even killed): so is the parent
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


def _run_agent(request: Mapping[str, Any], main: Any) -> None:
    """In the forked child: become the agent process, then leave (never back into the parent's loop)."""
    code: int = 1
    try:
        os.setsid()
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
        args = list(request["argv"])[1 + len(AGENT_MODULE) :]
        sys.argv = ["engine_agent.main", *args]
        result = main(args)
        code = int(result or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# --- the test side --------------------------------------------------------------------------------


class ForkedAgent:
    """A forked agent with the part of `subprocess.Popen`'s interface the harness uses."""

    def __init__(self, zygote: Zygote, pid: int, args: Sequence[str]) -> None:
        self.zygote = zygote
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.status(self.pid)
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


class Zygote:
    """The warmed parent, started by the test process; `spawn` forks an agent from it."""

    def __init__(self, workdir: Path, env: Mapping[str, str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.socket_path = str(workdir / "zygote.sock")
        self.log_path = workdir / "zygote.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.agent_zygote", self.socket_path],
                env=dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(
            lambda: os.path.exists(self.socket_path),
            timeout_s=120,
            what="the agent zygote to import the agent",
            alive=lambda: self.process.poll() is None,
            describe=lambda: self.log_path.read_text(errors="replace")[-2000:],
        )

    def _ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(30)
            connection.connect(self.socket_path)
            connection.sendall(json.dumps(request).encode() + b"\n")
            answer: dict[str, Any] = json.loads(connection.makefile("rb").readline())
            return answer

    def spawn(self, argv: Sequence[str], log_path: Path, env: Mapping[str, str], cwd: Path) -> ForkedAgent:
        if list(argv[1 : 1 + len(AGENT_MODULE)]) != AGENT_MODULE:
            raise ValueError(f"the zygote starts agents only, not {argv!r}")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        request = {"op": "spawn", "argv": list(argv), "env": dict(env), "cwd": str(cwd), "log": str(log_path)}
        return ForkedAgent(self, int(self._ask(request)["pid"]), argv)

    def status(self, pid: int) -> int | None:
        code = self._ask({"op": "status", "pid": pid})["returncode"]
        return None if code is None else int(code)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        with contextlib.suppress(OSError):
            os.unlink(self.socket_path)


if __name__ == "__main__":
    serve(sys.argv[1])
