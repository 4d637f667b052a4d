"""One engine agent hosted by Ray: the body of the detached named actor the Ray launcher starts.

The coordinator's Ray launcher (`app/launchers/ray_launcher.py`) wraps `AgentHost` with `ray.remote`
and creates one actor per engine, named after the engine id and pinned to one placement-group bundle.
The actor starts `epctl-agent` as its child process on its node (binding the node's address, port 0),
reports the agent's URL once it serves, and stops it on request.

- The agent's output is the actor's own stdout/stderr, so Ray keeps it with the actor's log
  (`ray logs actor --id <actor id>`, or the dashboard's actor page).
- The bearer token and the deployment's agent keys come in as constructor arguments and reach the
  agent through its environment (`EPCTL_TOKEN`, `EPCTL_AGENT_KEY`, `EPCTL_AGENT_KEY_PREVIOUS` with
  `EPCTL_AGENT_KEY_PREVIOUS_UNTIL`): never on a command line (any local user reads it), never in Ray's
  runtime_env (the dashboard and `ray list actors --detail` display it). Constructor arguments travel
  in the actor's creation task, which Ray serializes into its object store and does not display.
- The agent starts from the allow-list of the worker's environment (`engine_agent.environment`), plus
  the names the deployment's `runtime_env.env_vars` set on purpose: a Ray node's own settings and
  secrets do not reach the engine.
- The actor and its agent live and die together: Ray kills the child when the actor dies (killed,
  node lost), and the actor exits when its serving agent does, so Ray's view of the actor is the
  engine's. An agent that exits before it serves is reported by `wait_ready` (with its exit code).

Standard library only at import time: a Ray worker imports this module to build the actor.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from engine_agent.environment import engine_environment

STOP_GRACE_S = 3.0


class AgentExitedError(RuntimeError):
    """The agent process ended before it served."""


def agent_executable() -> list[str]:
    """`epctl-agent` beside this interpreter (the node's environment), else on PATH, else the module."""
    beside = Path(sys.executable).with_name("epctl-agent")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("epctl-agent")
    if found:
        return [found]
    return [sys.executable, "-c", "from engine_agent.main import main; main()"]


def node_identity() -> tuple[str, str]:
    """(Ray node id, node IP address) of the node this actor runs on."""
    import ray

    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


class AgentHost:
    def __init__(
        self,
        engine_id: str,
        agent_args: list[str],
        *,
        token: str | None = None,
        agent_key: str | None = None,
        agent_key_previous: str | None = None,
        agent_key_previous_until: float | None = None,
        env_names: list[str] | None = None,
        host: str | None = None,
        executable: list[str] | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.node_id, node_ip = node_identity()
        self.host = host or node_ip
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"epctl-{engine_id}-"))
        self.ready_file = self.run_dir / "ready"
        self.url: str | None = None
        self.stopping = False
        with_end = agent_key_previous is not None and agent_key_previous_until is not None
        given = {
            "EPCTL_TOKEN": token,
            "EPCTL_AGENT_KEY": agent_key,
            "EPCTL_AGENT_KEY_PREVIOUS": agent_key_previous if with_end else None,
            "EPCTL_AGENT_KEY_PREVIOUS_UNTIL": f"{agent_key_previous_until:.3f}" if with_end else None,
        }
        env = engine_environment(os.environ, given, extra_names=env_names or ())
        command = [
            *(executable or agent_executable()),
            "--host",
            self.host,
            "--port",
            "0",
            "--ready-file",
            str(self.ready_file),
            "--engine-id",
            engine_id,
            *agent_args,
        ]
        print(f"epctl: engine {engine_id} on Ray node {self.node_id}: starting {command[0]}", flush=True)
        # stdout/stderr inherited: the agent's log is the actor's log.
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env)
        threading.Thread(target=self._exit_with_agent, name="agent-watch", daemon=True).start()

    def _exit_with_agent(self) -> None:
        code = self.process.wait()
        print(f"epctl: agent of engine {self.engine_id} exited with code {code}", flush=True)
        if not self.stopping and self.url is not None:
            # A serving engine is gone: end the actor too, so that Ray shows it dead. (Before it served,
            # `wait_ready` reports the exit code to the launcher, which stops the actor.)
            os._exit(70)

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """Block until the agent serves; raises `AgentExitedError` or `TimeoutError`."""
        give_up = time.monotonic() + timeout_s
        while True:
            try:
                text = self.ready_file.read_text().strip()
            except FileNotFoundError:
                text = ""
            if text:
                self.url = text.splitlines()[0].rstrip("/")
                return self.describe()
            code = self.process.poll()
            if code is not None:
                raise AgentExitedError(
                    f"agent of engine {self.engine_id} exited with code {code} before it served "
                    "(its output is in this actor's log)"
                )
            if time.monotonic() >= give_up:
                raise TimeoutError(f"agent of engine {self.engine_id} did not serve within {timeout_s:.1f}s")
            time.sleep(0.05)

    def describe(self) -> dict[str, Any]:
        return {
            "engine_id": self.engine_id,
            "url": self.url,
            "node_id": self.node_id,
            "host": self.host,
            "agent_pid": self.process.pid,
            "actor_pid": os.getpid(),
            "returncode": self.process.poll(),
        }

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the agent, SIGKILL after `grace_s`; returns its exit code."""
        self.stopping = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return self.process.returncode
