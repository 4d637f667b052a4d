"""The suite's agent zygote (`engine_agent/zygote.py`): torch and the agent's modules are imported once
per test session instead of once per agent (4-13 s of CPU each on a 2-core machine). The agent tests
fork their agents from it (`spawn`); coordinators and `epctl up` the tests start are given its socket
(`EPCTL_RUNNER_LOCAL_AGENT_ZYGOTE`), so their local launchers fork theirs from it too. Tests of a fresh
interpreter's own start (its imports, its command line) keep starting real interpreters.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.launchers.zygote import ForkedProcess, spawn
from engine_agent.zygote import zygote_command
from tests.support.waiting import wait_until

AGENT_MODULE = ["-m", "engine_agent.main"]


# --- the test side --------------------------------------------------------------------------------


class Zygote:
    """The warmed parent, started by the test process; `spawn` forks an agent from it."""

    def __init__(self, workdir: Path, env: Mapping[str, str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.socket_path = str(workdir / "zygote.sock")
        self.log_path = workdir / "zygote.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                zygote_command(sys.executable, self.socket_path),
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

    def spawn(self, argv: Sequence[str], log_path: Path, env: Mapping[str, str], cwd: Path) -> ForkedProcess:
        if list(argv[1 : 1 + len(AGENT_MODULE)]) != AGENT_MODULE:
            raise ValueError(f"the zygote starts agents only, not {argv!r}")
        args = list(argv)[1 + len(AGENT_MODULE) :]
        return spawn(self.socket_path, args, argv=argv, env=env, cwd=cwd, log_path=log_path)

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
