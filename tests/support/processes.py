"""The one process harness: real coordinator and agent processes for tests and benchmarks.

- `free_port()`: a loopback port nobody holds right now.
- `wait_until(predicate, timeout_s, what)` (from `waiting.py`): poll a real condition; on timeout the
  error says what was awaited (and, with `describe`, what the world looked like).
- `Child`: a child process in its own session with its log in a file; `stop()` is SIGTERM then
  SIGKILL to the whole group, `kill()` a crash.
- `Coordinator`: `python -m uvicorn app.main:app` (or `epctl serve`) on a free port with its own data
  directory, database and admin token; can be SIGKILLed and started again on the same port, database
  and data directory; stops the agents its local launcher started.
- `start_agents(...)`: `python -m engine_agent.main` processes on port 0, each reporting its URL
  through `--ready-file`.

Torch- and pytest-free, so `benchmarks/` import it too (see `benchmarks/common.py`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, TypeVar

import httpx

from tests.support.jobs import TERMINAL_JOB_STATES, job, wait_job
from tests.support.waiting import WaitTimeout, wait_until

if TYPE_CHECKING:
    from tests.support.agent_zygote import Zygote

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
ADMIN_TOKEN = "test-admin-token-0123456789abcdef"


def free_port() -> int:
    """A port the kernel considers free right now (only where a child cannot report its own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Where the suite's agent zygote listens, asked on a child's first start (the zygote starts then; the
# session fixture in tests/support/fixtures.py sets it): every coordinator and `epctl up` this harness
# starts is given it, so their local launchers fork agents from it instead of importing torch each.
agent_zygote_socket: Callable[[], str] | None = None
ZYGOTE_SETTING = "EPCTL_RUNNER_LOCAL_AGENT_ZYGOTE"


def clean_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any coordinator setting (EPCTL_*, DATABASE_URL), plus `extra`:
    a child sees only the settings its test chose (and the suite's agent zygote, unless `extra` names
    another or "")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPCTL_") and k != "DATABASE_URL"}
    env["PYTHONUNBUFFERED"] = "1"
    # Every child runs this checkout's code, agents too: the coordinator's launcher starts the console
    # script `epctl-agent` of the shared environment, whose editable install points at the main checkout
    # (run from a worktree, the agents ran main's code).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if agent_zygote_socket is not None and ZYGOTE_SETTING not in (extra or {}):
        env[ZYGOTE_SETTING] = agent_zygote_socket()
    env.update(extra or {})
    return env


# --- one child process --------------------------------------------------------------------------------


class ProcessHandle(Protocol):
    """What the harness uses of `subprocess.Popen` (an agent forked by the zygote has the same)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


@dataclass
class Child:
    """A child in its own session (process group), its output appended to `log_path`."""

    name: str
    popen: ProcessHandle
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for(self, predicate: Callable[[], T | None], *, timeout_s: float, what: str) -> T:
        """`wait_until` that gives up at once if this child dies, and shows its log if it gives up."""
        return wait_until(
            predicate,
            timeout_s=timeout_s,
            what=what,
            interval_s=0.05,
            alive=self.alive,
            describe=self.log_tail,
        )

    def log_tail(self, chars: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
        return f"--- {self.name} log ({self.log_path}) ---\n{text}"

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the group, SIGKILL if it is not gone within `grace_s`."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the group: no shutdown code runs, exactly like a crash."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def interrupt(self, grace_s: float = 30.0) -> None:
        """Ctrl-C (SIGINT to the child), then stop() if it does not exit in time."""
        if self.alive():
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.stop()


def spawn(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
) -> Child:
    """Start `argv` in its own session with stdout and stderr appended to `log_path`.
    `env`: the child's whole environment (default: this process's)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Child(name, popen, log_path)


# --- the coordinator ------------------------------------------------------------------------------


@dataclass
class Coordinator:
    """A real coordinator process on `database_url`, with its data directory and admin token.

    `env` adds settings (EPCTL_*) to a clean environment; the job runner is off unless `env` turns it
    on (`EPCTL_RUNNER_ENABLED=true`). `command="serve"` runs the `epctl serve` console script instead of
    uvicorn. The port is chosen once, so a restarted coordinator answers at the same URL."""

    database_url: str
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    admin_token: str = ADMIN_TOKEN
    command: Literal["uvicorn", "serve"] = "uvicorn"
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    child: Child | None = field(default=None, init=False)
    _started: bool = field(default=False, init=False, repr=False)
    _api: httpx.Client | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.log_path or self.data_dir / "coordinator.log"

    def environment(self, **extra: str) -> dict[str, str]:
        settings = {
            "DATABASE_URL": self.database_url,
            "EPCTL_DATA_DIR": str(self.data_dir),
            "EPCTL_ADMIN_TOKEN": self.admin_token,
            "EPCTL_HOST": "127.0.0.1",
            "EPCTL_PORT": str(self.port),
            "EPCTL_RUNNER_ENABLED": "false",
        }
        return clean_environment({**settings, **self.env, **extra})

    def argv(self) -> list[str]:
        if self.command == "serve":
            return [*epctl_command(), "serve", "--port", str(self.port)]
        return [PYTHON, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(self.port),
                "--log-level", "warning", "--no-access-log"]  # fmt: skip

    def start(self, *, ready_timeout_s: float = 60.0, **env: str) -> Self:
        """Start (or start again) and wait until /readyz answers 200. `env`: settings for this start only.

        The port comes from `free_port()`, so another process may bind it first: a first start that
        loses its port that way tries again on another one (a restart keeps its URL, so it cannot)."""
        if self.child is not None and self.child.alive():
            raise RuntimeError(f"coordinator on {self.url} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
            child = self.child = spawn("coordinator", self.argv(), self.log_file, env=self.environment(**env))
            try:
                self._wait_ready(child, ready_timeout_s)
            except WaitTimeout:
                with self.log_file.open("rb") as log:
                    log.seek(log_offset)
                    lost_port = b"address already in use" in log.read()
                if child.alive() or not lost_port or self._started or attempt == 2:
                    raise
                self.port = free_port()
                continue
            self._started = True
            return self
        raise AssertionError("unreachable")

    def spawn(self, **env: str) -> Child:
        """Start without waiting (`wait_ready` waits): several coordinators can start at once."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.child = spawn("coordinator", self.argv(), self.log_file, env=self.environment(**env))
        return self.child

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        assert self.child is not None, "spawn() first"
        self._wait_ready(self.child, timeout_s)
        self._started = True

    def _wait_ready(self, child: Child, timeout_s: float) -> None:
        def ready() -> bool:  # our child, not whoever else may answer on this port
            return child.alive() and httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200

        child.wait_for(ready, timeout_s=timeout_s, what=f"the coordinator on {self.url} to be ready")

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def stop(self) -> None:
        """Graceful: SIGTERM (shutdown hooks run), SIGKILL after 10 s."""
        if self.child is not None:
            self.child.stop()

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, leases stay held, local agents keep running."""
        if self.child is not None:
            self.child.kill()

    def stop_local_agents(self) -> None:
        """The agents its local launcher started run in their own sessions and outlive the coordinator
        by design: stop every one it recorded (with the launcher's own code)."""
        stop_local_agents(self.data_dir)

    def close(self) -> None:
        self.stop()
        self.stop_local_agents()
        if self._api is not None:
            self._api.close()
            self._api = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # --- talking to it ------------------------------------------------------------------------------

    def client(self, token: str | None = None, timeout_s: float = 10.0) -> httpx.Client:
        """A new client with `token` (default: the admin token); the caller closes it."""
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    @property
    def api(self) -> httpx.Client:
        """One shared admin client, closed by `close()`."""
        if self._api is None:
            self._api = self.client()
        return self._api

    def job(self, job_id: str) -> dict[str, Any]:
        return job(self.api, job_id)

    def wait_job(
        self, job_id: str, *, timeout_s: float = 90.0, until: Iterable[str] = TERMINAL_JOB_STATES
    ) -> dict[str, Any]:
        return wait_job(self.api, job_id, timeout_s=timeout_s, until=until, describe=self.log_tail)


def stop_local_agents(data_dir: Path) -> None:
    """Every engine the data directory's records name (agents and vLLM servers outlive a coordinator)."""
    from app.backends.vllm.launcher import VllmLauncher
    from app.launchers.local import LocalLauncher

    LocalLauncher(data_dir).stop_all()
    VllmLauncher(data_dir, python=PYTHON).stop_all()


def epctl_command() -> list[str]:
    """The installed `epctl` console script, or the module where it is not installed."""
    script = Path(PYTHON).with_name("epctl")
    return [str(script)] if script.exists() else [PYTHON, "-m", "app.cli.main"]


# --- agents ---------------------------------------------------------------------------------------


@dataclass
class StartedAgent:
    engine_id: str
    url: str
    child: Child


def agent_argv(
    engine_id: str,
    ready_file: Path,
    *,
    flags: Mapping[str, str] | None = None,
    engine_args: Sequence[str] = (),
) -> list[str]:
    """`python -m engine_agent.main` on a free port that reports its URL in `ready_file`.
    `flags`: more options, `{"log_level": "info"}` -> `--log-level info`; `engine_args` go last."""
    argv = [PYTHON, "-m", "engine_agent.main", "--host", "127.0.0.1", "--port", "0",
            "--engine-id", engine_id, "--ready-file", str(ready_file)]  # fmt: skip
    for name, value in (flags or {}).items():
        argv += [f"--{name.replace('_', '-')}", value]
    return [*argv, *engine_args]


def wait_ready_file(path: Path, child: Child, timeout_s: float = 60.0) -> str:
    """What a child wrote to its ready file (written whole, through a rename)."""

    def written() -> str:
        with contextlib.suppress(OSError):
            return path.read_text().strip()
        return ""

    return child.wait_for(written, timeout_s=timeout_s, what=f"{child.name} to write {path.name}")


# The agent key every agent this harness starts is given (EPCTL_AGENT_KEY, as a launcher gives it):
# one per test run. Drivers send it (`AGENT_KEY_HEADERS`); an `env` may override it.
AGENT_KEY = "epak_test_" + secrets.token_urlsafe(24)
AGENT_KEY_HEADERS = {"Authorization": f"Bearer {AGENT_KEY}"}


def start_agents(
    engine_ids: Sequence[str],
    workdir: Path,
    *,
    flags: Mapping[str, str] | None = None,
    engine_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 60.0,
    per_agent_env: Mapping[str, Mapping[str, str]] | None = None,
    zygote: Zygote | None = None,
) -> list[StartedAgent]:
    """Start one agent per id at once (they import torch in parallel), then wait until every one serves
    HTTP. On any failure every one of them is stopped before the error propagates. `per_agent_env`:
    more variables for some agents, by id; `zygote`: fork them from that warmed interpreter instead
    (`agent_zygote.py`: the same agent, without importing torch again)."""
    environment = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "EPCTL_AGENT_KEY": AGENT_KEY,
        **(env or {}),
    }
    launched: list[tuple[str, Path, Child]] = []
    try:
        for engine_id in engine_ids:
            ready = workdir / f"{engine_id}.ready"
            ready.unlink(missing_ok=True)
            argv = agent_argv(engine_id, ready, flags=flags, engine_args=engine_args)
            own = {**environment, **(per_agent_env or {}).get(engine_id, {})}
            log_path = workdir / f"{engine_id}.log"
            if zygote is not None:
                child = Child(f"agent {engine_id}", zygote.spawn(argv, log_path, own, ROOT), log_path)
            else:
                child = spawn(f"agent {engine_id}", argv, log_path, env=own)
            launched.append((engine_id, ready, child))
        return [
            StartedAgent(engine_id, wait_ready_file(ready, child, ready_timeout_s), child)
            for engine_id, ready, child in launched
        ]
    except BaseException:
        for _, _, child in launched:
            child.kill()
        raise
