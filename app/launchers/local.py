"""The local launcher: `epctl-agent` processes on this machine (the embedded default).

Each agent starts with `--port 0 --ready-file F` (the agent binds a free port and writes its URL to F
once it serves), `--coordinator/--deployment` so it registers itself (its token in the environment,
`EPCTL_TOKEN`, never on the command line), and the deployment's engine options. Pids are recorded
in `<state_dir>/local-agents.json`, so a coordinator restarted after a crash (any time later) adopts
the agents its predecessor started and can stop them, and `epctl down` stops them by that record.
Agents run in their own session, so a signal to the coordinator's terminal does not reach them, and
serving never depends on the coordinator: they outlive it, however long it is gone. Only an explicit
opt-in (`orphan_grace_s`, for throwaway machines) makes them watch it (`--parent-pid`) and exit once
it is gone and no coordinator answered their heartbeats for that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.launchers import readiness
from app.launchers.agent_args import deployment_agent_args
from app.launchers.base import EngineHandle, Launcher, LaunchError, LaunchSpec
from app.launchers.processes import ProcessRecords, is_alive, start_detached
from app.launchers.zygote import ForkedProcess
from app.launchers.zygote import spawn as zygote_spawn
from engine_agent.environment import engine_environment

PIDS_FILE = "local-agents.json"
STOP_GRACE_S = 3.0


def agent_executable() -> list[str]:
    """`epctl-agent` beside this interpreter, else the module through this interpreter."""
    beside = Path(sys.executable).with_name("epctl-agent")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("epctl-agent")
    if found:
        return [found]
    return [sys.executable, "-c", "from engine_agent.main import main; main()"]


def agent_command(
    spec: LaunchSpec,
    engine_id: str,
    ready_file: Path,
    executable: Sequence[str] | None = None,
    *,
    orphan_grace_s: float | None = None,
    host: str = "127.0.0.1",
    data_host: str | None = None,
) -> list[str]:
    watch: list[str] = []
    if orphan_grace_s is not None:
        # Opted in (throwaway machines): the agent exits once we are gone, unless a coordinator adopts it.
        watch = ["--parent-pid", str(os.getpid()), "--orphan-grace-s", str(orphan_grace_s)]
    return [
        *(executable or agent_executable()),
        "--host",
        host,
        *(["--data-host", data_host] if data_host else []),
        "--port",
        "0",
        "--ready-file",
        str(ready_file),
        "--engine-id",
        engine_id,
        *deployment_agent_args(spec, watch),
    ]


AGENT_TOKEN_ENV = "EPCTL_TOKEN"


def agent_environment(spec: LaunchSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The agent's environment: the allow-list of ours (`engine_agent.environment`: the platform's and
    the agent's own settings, none of the coordinator's secrets), its bearer token in EPCTL_TOKEN
    (readable only by the same user, unlike argv; none when the spec has none) and its keys."""
    given = {AGENT_TOKEN_ENV: spec.token if spec.coordinator_url else None, **spec.agent_key_environment()}
    return engine_environment(os.environ if base is None else base, given)


def read_ready_file(path: Path) -> dict[str, Any] | None:
    """The agent's ready file: JSON with at least `url`, or a bare URL / port. None until written."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        data = text
    if isinstance(data, dict):
        if "url" not in data and "port" in data:
            data["url"] = f"http://{data.get('host', '127.0.0.1')}:{data['port']}"
        return data if "url" in data else None
    if isinstance(data, int) or (isinstance(data, str) and data.isdigit()):
        return {"url": f"http://127.0.0.1:{int(data)}"}
    if isinstance(data, str) and data.startswith("http"):
        return {"url": data}
    return None


def is_agent_process(pid: int, engine_id: str) -> bool:
    """Whether `pid` is still the agent we started (a recorded pid may have been reused since)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no procfs to check against: trust the record
    return engine_id.encode() in cmdline


def process_cpu_s(pid: int) -> float | None:
    """The CPU time (user + system, seconds) process `pid` has used; None without procfs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_tail(path: str | None, nbytes: int = 4096) -> str | None:
    """The last lines of an agent's log (what it said before it exited); None without one."""
    if not path:
        return None
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - nbytes))
            return readiness.last_words(log.read().decode(errors="replace"))
    except OSError:
        return None


def load_per_cpu() -> float:
    """The 1-minute load average per CPU (0 where the platform has none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def stop_pid(pid: int, grace_s: float = STOP_GRACE_S) -> bool:
    """SIGTERM, then SIGKILL after `grace_s`; returns once the process is gone: whether it was running.
    SIGCONT follows the SIGTERM: a frozen (SIGSTOPped) agent handles it at once, not after the grace."""
    if not is_alive(pid):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return False
    give_up = time.monotonic() + grace_s
    while time.monotonic() < give_up:
        if not is_alive(pid):
            return True
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    give_up = time.monotonic() + 2.0
    while time.monotonic() < give_up and is_alive(pid):
        time.sleep(0.02)
    return True


def is_handle(result: object) -> bool:
    return isinstance(result, EngineHandle)


class LocalLauncher(Launcher):
    name = "local"

    def __init__(
        self,
        state_dir: Path,
        *,
        ready_timeout_s: float = 30.0,
        executable: Sequence[str] | None = None,
        orphan_grace_s: float | None = None,
        host: str = "127.0.0.1",
        data_host: str | None = None,
        zygote: str | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        # An agent zygote's socket (`engine_agent/zygote.py`): agents forked from it skip importing torch.
        self.zygote = zygote or None
        self.host, self.data_host = host, data_host  # the agents' control and data addresses
        self.orphan_grace_s = orphan_grace_s
        self.executable = list(executable) if executable else None  # default: epctl-agent
        # The coordinator's launch deadline; each launch waits for the deadline its caller passes
        # (`Launcher.launch_budget`: the deployment's launch_timeout_s, else adaptive from this one).
        self.ready_timeout_s = ready_timeout_s
        self._late: dict[str, tuple[str, str]] = {}  # engine id -> (deployment, what it is doing)
        self._processes: dict[str, subprocess.Popen[bytes] | ForkedProcess] = {}
        self._lock = asyncio.Lock()
        self._records = ProcessRecords(self.state_dir / PIDS_FILE)

    # --- the pid record ---------------------------------------------------------------------------

    def records(self) -> dict[str, dict[str, Any]]:
        return self._records.read()

    # --- the interface ----------------------------------------------------------------------------

    async def ensure_engines(
        self, spec: LaunchSpec, count: int, idle: Sequence[EngineHandle], *, deadline_s: float
    ) -> list[EngineHandle]:
        chosen = list(idle[:count])
        missing = count - len(chosen)
        if missing <= 0:
            return chosen
        async with self._lock:
            started = [self._start(spec) for _ in range(missing)]
        try:
            ready = await asyncio.gather(
                *(
                    self._wait_ready(spec, engine_id, ready_file, deadline_s)
                    for engine_id, ready_file in started
                )
            )
        except BaseException:
            await asyncio.to_thread(self._stop_ids, [engine_id for engine_id, _ in started])
            raise
        return chosen + list(ready)

    async def ensure_some(
        self, spec: LaunchSpec, count: int, idle: Sequence[EngineHandle], *, deadline_s: float
    ) -> tuple[list[EngineHandle], LaunchError | None]:
        """Start what is missing; those that do not come up are stopped and left out (the first one's
        error says why)."""
        chosen = list(idle[:count])
        missing = count - len(chosen)
        if missing <= 0:
            return chosen, None
        async with self._lock:
            started = [self._start(spec) for _ in range(missing)]
        try:
            results = await asyncio.gather(
                *(
                    self._wait_ready(spec, engine_id, ready_file, deadline_s)
                    for engine_id, ready_file in started
                ),
                return_exceptions=True,
            )
        except BaseException:  # cancelled: stop everything this call started
            await asyncio.to_thread(self._stop_ids, [engine_id for engine_id, _ in started])
            raise
        failed = [engine_id for (engine_id, _), r in zip(started, results, strict=True) if not is_handle(r)]
        if failed:
            await asyncio.to_thread(self._stop_ids, failed)
        errors = [r for r in results if isinstance(r, BaseException)]
        error = next((e for e in errors if isinstance(e, LaunchError)), None)
        if errors and error is None:
            error = LaunchError(f"{len(errors)} of {missing} engines did not start: {errors[0]!r}")
        return chosen + [r for r in results if isinstance(r, EngineHandle)], error

    async def release(self, spec: LaunchSpec, engines: Sequence[EngineHandle]) -> list[str]:
        return await asyncio.to_thread(self._stop_handles, engines)

    async def release_lost(self, engines: Sequence[EngineHandle]) -> None:
        await asyncio.to_thread(self._stop_handles, engines)  # SIGTERM, then SIGKILL: a frozen one too

    def _stop_handles(self, engines: Sequence[EngineHandle]) -> list[str]:
        """Stop the engines we (or a predecessor on this data directory) started, and those another
        coordinator sharing the database started on this host: their pid is known from their
        registration, and the process's command line must name the engine (pids are reused)."""
        records = self.records()
        ours = [e.engine_id for e in engines if e.engine_id in records or e.engine_id in self._processes]
        self._stop_ids(ours)
        theirs = [
            e for e in engines if e.engine_id not in ours and e.pid and is_agent_process(e.pid, e.engine_id)
        ]
        for engine in theirs:
            assert engine.pid is not None
            stop_pid(engine.pid)
        return ours + [e.engine_id for e in theirs]

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.stop_all)

    def stop_all(self, deployment: str | None = None) -> list[str]:
        """Stop every agent recorded (of one deployment, if given), including a predecessor's; the ids
        of those that were running (the records of the others, long gone, are dropped too)."""
        ids = [
            engine_id
            for engine_id, entry in self.records().items()
            if deployment is None or entry.get("deployment") == deployment
        ]
        ids += [i for i in self._processes if i not in ids]
        return self._stop_ids(ids)

    # --- processes --------------------------------------------------------------------------------

    def _start(self, spec: LaunchSpec) -> tuple[str, Path]:
        engine_id = f"{spec.deployment}-{uuid.uuid4().hex[:8]}"
        run_dir = self.state_dir / "agents"
        run_dir.mkdir(parents=True, exist_ok=True)
        ready_file = run_dir / f"{engine_id}.ready"
        ready_file.unlink(missing_ok=True)
        log_path = run_dir / f"{engine_id}.log"
        command = agent_command(
            spec,
            engine_id,
            ready_file,
            self.executable,
            orphan_grace_s=self.orphan_grace_s,
            host=self.host,
            data_host=self.data_host,
        )
        process = self._spawn(command, agent_environment(spec), log_path)
        self._processes[engine_id] = process
        self._records.set(
            engine_id,
            {
                "pid": process.pid,
                "deployment": spec.deployment,
                "log": str(log_path),
                "started_at": time.time(),
                "url": None,
            },
        )
        return engine_id, ready_file

    def _spawn(
        self, command: list[str], env: dict[str, str], log_path: Path
    ) -> subprocess.Popen[bytes] | ForkedProcess:
        """Forked from the zygote where one is set and answers (only the default agent: another command
        is not what it imported), else a fresh interpreter: a zygote gone costs time, never a launch."""
        if self.zygote and self.executable is None:
            args = command[len(agent_executable()) :]
            with contextlib.suppress(OSError):
                return zygote_spawn(
                    self.zygote, args, argv=["epctl-agent", *args], env=env, cwd=Path.cwd(), log_path=log_path
                )
        return start_detached(command, env=env, log_path=log_path)

    def still_starting(self, deployment: str) -> dict[str, str]:
        return {
            engine_id: note for engine_id, (owner, note) in list(self._late.items()) if owner == deployment
        }

    async def _wait_ready(
        self, spec: LaunchSpec, engine_id: str, ready_file: Path, deadline_s: float
    ) -> EngineHandle:
        """Until the agent writes its ready file; how long is `app.launchers.readiness`'s rule (a set
        deadline as given; an adaptive one stretched on a loaded machine and for an agent still working
        past it). A process that exits fails the launch at once, with the end of its log."""
        process = self._processes[engine_id]
        started = time.monotonic()
        cpu_seen: list[tuple[float, float]] = []  # (monotonic, CPU seconds of the process)
        adaptive = spec.launch_timeout_s is None
        try:
            while True:
                data = read_ready_file(ready_file)
                if data is not None:
                    self.launch_history.record(spec.deployment, time.monotonic() - started)
                    url = str(data["url"]).rstrip("/")
                    entry = self.records().get(engine_id, {})
                    entry.update({"url": url, "pid": process.pid})
                    self._records.set(engine_id, entry)
                    return EngineHandle(
                        engine_id=str(data.get("engine_id", engine_id)), url=url, pid=process.pid
                    )
                progress = self._progress(process, started, cpu_seen)
                state = readiness.judge(progress, deadline_s, adaptive=adaptive)
                if state is not readiness.LaunchState.waiting:
                    log_path = self.records().get(engine_id, {}).get("log")
                    said = log_tail(log_path) if state is readiness.LaunchState.exited else None
                    type_, message = readiness.explain(state, engine_id, progress, log_path, said)
                    raise LaunchError(message, engine_id, type_=type_)
                note = readiness.waiting_note(engine_id, progress, deadline_s)
                if note is not None:
                    self._late[engine_id] = (spec.deployment, note)
                await asyncio.sleep(0.05)
        finally:
            self._late.pop(engine_id, None)

    @staticmethod
    def _progress(
        process: subprocess.Popen[bytes] | ForkedProcess, started: float, cpu_seen: list[tuple[float, float]]
    ) -> readiness.Progress:
        """One look at a launching agent: its exit code, the CPU it used in the last window, the load."""
        now = time.monotonic()
        cpu = process_cpu_s(process.pid)
        if cpu is not None:
            cpu_seen.append((now, cpu))
            while len(cpu_seen) > 1 and cpu_seen[1][0] <= now - readiness.PROGRESS_WINDOW_S:
                cpu_seen.pop(0)
        return readiness.Progress(
            elapsed_s=now - started,
            exit_code=process.poll(),
            cpu_gain_s=cpu_seen[-1][1] - cpu_seen[0][1]
            if len(cpu_seen) > 1 and cpu_seen[0][0] <= now - readiness.PROGRESS_WINDOW_S
            else None,
            load_per_cpu=load_per_cpu(),
        )

    def _stop_ids(self, engine_ids: Sequence[str]) -> list[str]:
        """Stop these engines' processes and drop their records; the ids of those that were running."""
        records = self.records()
        stopped: list[str] = []
        for engine_id in engine_ids:
            process = self._processes.pop(engine_id, None)
            entry = records.get(engine_id)
            pid = process.pid if process is not None else (entry or {}).get("pid")
            if not isinstance(pid, int) or pid <= 0:
                pass
            elif (process is not None or is_agent_process(pid, engine_id)) and stop_pid(pid):
                stopped.append(engine_id)
            if process is not None:
                with contextlib.suppress(Exception):
                    process.wait(timeout=1.0)
            self._records.set(engine_id, None)
        return stopped
