"""A coordinator in the root namespace and agents started by hand in test hosts (`tests/support/netns.py`).

- `HostsCoordinator`: the e2e coordinator (runner on, short deadlines) listening on the control
  bridge's root address, so agents in the hosts reach it and it reaches them.
- `start_host_agent(...)`: one `static` agent inside a host: `--host` its control address, `--data-host`
  its data address, registering itself with the coordinator (its bearer token in `EPCTL_TOKEN`).
- `HostClient`: the e2e steady client, its threads inside a host's network namespace, so what a
  client on that host sees is what it records (a cut control link does not cut a host's own clients).

Pytest-free: `benchmarks/hosts.py` builds the same clusters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_agent.engine_options import engine_args
from tests.support.netns import CONTROL_ROOT, Host, Hosts, enter
from tests.support.processes import AGENT_KEY, PYTHON, Child, wait_ready_file
from tests.support.stack import ENGINE, StackCoordinator, SteadyClient


class HostsCoordinator(StackCoordinator):
    """Listens on the control network's root address (198.18.0.254), not loopback."""

    @property
    def url(self) -> str:
        return f"http://{CONTROL_ROOT}:{self.port}"

    front_doors = ""  # EPCTL_FRONT_DOORS, kept through restarts (a front door in the root namespace)

    def environment(self, **extra: str) -> dict[str, str]:
        doors = {"EPCTL_FRONT_DOORS": self.front_doors} if self.front_doors else {}
        return super().environment(**{"EPCTL_HOST": CONTROL_ROOT, **doors, **extra})

    def restart(self, **env: str) -> None:
        """SIGKILL (the engines outlive it), start again on the same port (the new one adopts them);
        the shared client's kept-alive connection died with the old process, so it is made anew."""
        self.kill()
        if self._api is not None:
            self._api.close()
            self._api = None
        self.start(ready_timeout_s=60.0, **env)

    def argv(self) -> list[str]:
        return [PYTHON, "-m", "uvicorn", "app.main:app", "--host", CONTROL_ROOT, "--port", str(self.port),
                "--log-level", "warning", "--no-access-log"]  # fmt: skip


@dataclass
class HostAgent:
    engine_id: str
    host: Host
    url: str
    child: Child


def spawn_host_agent(
    hosts: Hosts,
    host: Host,
    engine_id: str,
    workdir: Path,
    coordinator: StackCoordinator,
    deployment: str = "demo",
    extra_env: dict[str, str] | None = None,
) -> tuple[Child, Path]:
    """Start one agent inside `host` (without waiting): control on `host.control`, data on `host.data`."""
    ready = workdir / f"{engine_id}.ready"
    ready.unlink(missing_ok=True)
    argv = [PYTHON, "-m", "engine_agent.main", "--host", host.control, "--data-host", host.data,
            "--port", "0", "--engine-id", engine_id, "--ready-file", str(ready),
            "--coordinator", coordinator.url, "--deployment", deployment, "--heartbeat-s", "1",
            "--enable-fault-injection", *engine_args(ENGINE)]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "EPCTL_TOKEN": coordinator.admin_token,
        "EPCTL_AGENT_KEY": AGENT_KEY,  # the deployment's (the harness creates it with this key)
        **(extra_env or {}),
    }
    child = hosts.spawn_in(host, f"agent {engine_id}", argv, workdir / f"{engine_id}.log", env=env)
    return child, ready


def start_host_agents(
    hosts: Hosts,
    placement: list[tuple[Host, str]],
    workdir: Path,
    coordinator: StackCoordinator,
    deployment: str = "demo",
) -> list[HostAgent]:
    """One agent per (host, engine id), started at once, each waited for until it serves HTTP."""
    started: list[tuple[Host, str, Child, Path]] = []
    try:
        for host, engine_id in placement:
            child, ready = spawn_host_agent(hosts, host, engine_id, workdir, coordinator, deployment)
            started.append((host, engine_id, child, ready))
        return [
            HostAgent(engine_id, host, wait_ready_file(ready, child, 90.0), child)
            for host, engine_id, child, ready in started
        ]
    except BaseException:
        for _, _, child, _ in started:
            child.kill()
        raise


@dataclass
class HostClient(SteadyClient):
    """A steady client whose threads run inside `host`'s network namespace (None: the root one)."""

    host: Host | None = None

    def start(self) -> HostClient:
        super().start()
        return self

    def _run(self, stream: int) -> None:
        if self.host is not None:
            enter(self.host)
        super()._run(stream)


def registered(coordinator: StackCoordinator, name: str = "demo") -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in coordinator.engines(name)}
