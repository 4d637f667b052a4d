"""Starting (or adopting) a local HAProxy as a deployment's front door (`epctl up`, tests).

Its files live in `<state dir>/front-door/`: `haproxy.cfg`, `haproxy.log`, and the admin socket. An
HAProxy still answering on that socket (a previous `epctl up` that crashed: the front door kept serving
on its last rank set) is adopted, not replaced; one this process started is stopped by its pid."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from app.frontdoor.haproxy import QUEUE_TIMEOUT_S, DoorConfig, render_config

SOCKET_PATH_MAX = 100  # a Unix socket path must fit 108 bytes


class FrontDoorUnavailable(RuntimeError):
    """No HAProxy could be started (not installed, the port taken, a bad config): the message says why."""


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).exists()), None
    )


def socket_path_for(directory: Path, name: str = "admin.sock") -> str:
    path = str((directory / name).resolve())
    if len(path) <= SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha1(path.encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"epctl-haproxy-{digest}-{name}")


def answers(socket_path: str, timeout_s: float = 1.0) -> bool:
    """HAProxy's runtime API answers on this socket."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(socket_path)
            conn.sendall(b"show info\n")
            return b"Name:" in conn.recv(4096)
    except OSError:
        return False


@dataclass
class RunningDoor:
    url: str
    socket_path: str
    config_path: Path
    process: subprocess.Popen[bytes] | None  # None: adopted from an earlier run
    adopted_pid: int | None = None  # the adopted HAProxy's pid, when its pid file names it still
    request_log: str | None = None  # where HAProxy logs each request (the keeper binds it)

    @property
    def adopted(self) -> bool:
        return self.process is None

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the HAProxy this run started, or the one it adopted (by the pid its start recorded,
        checked against the process's command line)."""
        process = self.process
        if process is None:
            if self.adopted_pid is not None:
                _stop_pid(self.adopted_pid, grace_s)
            return
        if process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(grace_s)


def start_front_door(
    directory: Path,
    door: DoorConfig,
    ready_timeout_s: float = 10.0,
    *,
    hold: bool = True,
    queue_timeout_s: int = QUEUE_TIMEOUT_S,
) -> RunningDoor:
    """`hold`, `queue_timeout_s`: whether and how long requests wait while no engine is ready
    (`haproxy.render_config`)."""
    directory.mkdir(parents=True, exist_ok=True)
    socket_path = socket_path_for(directory)
    request_log = socket_path_for(directory, "requests.sock")
    config_path = directory / "haproxy.cfg"
    url = f"http://{door.bind_host}:{door.bind_port}"
    pid_path = directory / "haproxy.pid"
    if answers(socket_path):
        adopted = _recorded_pid(pid_path, config_path)
        logs = request_log if request_log in config_path.read_text(errors="replace") else None
        return RunningDoor(url, socket_path, config_path, None, adopted, logs)
    binary = haproxy_binary()
    if binary is None:
        raise FrontDoorUnavailable("haproxy is not installed (apt-get install haproxy)")
    Path(socket_path).unlink(missing_ok=True)
    if door.hold_socket is None:  # beside the admin socket, as short (a Unix socket path must fit 108 bytes)
        door = replace(door, hold_socket=socket_path_for(directory, "hold.sock"))
    config_path.write_text(
        render_config(
            socket_path, [door], request_log=request_log, hold=hold, queue_timeout_s=queue_timeout_s
        )
    )
    log_path = directory / "haproxy.log"
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            [binary, "-f", str(config_path), "-db"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of the terminal reaches epctl up, which stops it in turn
        )
    pid_path.write_text(f"{process.pid}\n")
    running = RunningDoor(url, socket_path, config_path, process, request_log=request_log)
    give_up = time.monotonic() + ready_timeout_s
    while not answers(socket_path, timeout_s=0.2):
        if process.poll() is not None or time.monotonic() > give_up:
            running.stop()
            tail = log_path.read_text(errors="replace")[-600:].strip()
            raise FrontDoorUnavailable(f"haproxy did not start ({tail or 'no output'})")
        time.sleep(0.05)
    return running


def _recorded_pid(pid_path: Path, config_path: Path) -> int | None:
    """The pid recorded at its start, if that process is still an HAProxy of this configuration."""
    try:
        pid = int(pid_path.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if str(config_path).encode() in cmdline else None


def _stop_pid(pid: int, grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    give_up = time.monotonic() + grace_s
    while _running(pid) and time.monotonic() < give_up:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (one that exited, waiting for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def stop_recorded_front_door(directory: Path) -> int | None:
    """`epctl down`: stop the HAProxy a crashed `epctl up` left in `directory` (its pid, if it is still
    that HAProxy); the pid stopped, or None."""
    pid = _recorded_pid(directory / "haproxy.pid", directory / "haproxy.cfg")
    if pid is not None:
        _stop_pid(pid, 5.0)
    return pid
