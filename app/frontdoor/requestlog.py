"""The front door's per-request timing: HAProxy logs every request (one datagram, `LOG_FORMAT`) to a
Unix socket the keeper binds, and the keeper keeps the recent ones in memory. A job's accounting reads
from them which requests were held by its commit window (in flight at the front door while the window
was open) and the longest one's wait. Cheap: HAProxy sends after each response, nothing is stored.

    epctl 1796608951.538 58 0 52 ep_demo e1 200 0 ----
          accepted at    Ta Tw Tr backend server status retries termination
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOG_FORMAT = "epctl %Ts.%ms %Ta %Tw %Tr %b %s %ST %rc %tsc"
KEEP = 50_000  # the most recent requests kept (a job's window is seconds: far more than it needs)


@dataclass(frozen=True)
class Logged:
    accepted_at: float  # epoch seconds
    total_ms: float  # accepted to the last byte answered (HAProxy's Ta)
    queued_ms: float  # waiting at the front door for a slot (Tw; -1 where it never queued: 0 here)
    backend: str
    server: str
    status: int
    retries: int

    @property
    def done_at(self) -> float:
        return self.accepted_at + self.total_ms / 1000.0


def parse(datagram: bytes) -> Logged | None:
    """One HAProxy log datagram (syslog header, then `LOG_FORMAT`), or None for any other line."""
    text = datagram.decode(errors="replace")
    at = text.find(" epctl ")
    if at < 0:
        return None
    fields = text[at + 7 :].split()
    if len(fields) < 8:
        return None
    try:
        return Logged(
            accepted_at=float(fields[0]),
            total_ms=max(float(fields[1]), 0.0),
            queued_ms=max(float(fields[2]), 0.0),
            backend=fields[4],
            server=fields[5],
            status=int(fields[6]),
            retries=int(fields[7].lstrip("+")),
        )
    except ValueError:
        return None


def held_in_window(
    logged: Iterable[Logged], backend: str, start: float | None, end: float | None
) -> dict[str, Any] | None:
    """Requests to `backend` in flight at the front door while the window [start, end] was open (they
    waited for it: the engines hold what arrives in it), and the longest one's total wait; None where
    there was no window."""
    if start is None or end is None:
        return None
    held = [r for r in logged if r.backend == backend and r.accepted_at <= end and r.done_at >= start]
    longest = max((r.total_ms for r in held), default=None)
    failed = sum(1 for r in held if r.status >= 500 or r.status < 100)
    return {"count": len(held), "longest_wait_ms": longest, "failed": failed}


class RequestLog:
    """Binds `path` (a Unix datagram socket) and keeps what HAProxy sends to it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.recent: deque[Logged] = deque(maxlen=KEEP)
        self._sock: socket.socket | None = None

    def open(self) -> None:
        Path(self.path).unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(self.path)
        sock.setblocking(False)
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        for _ in range(1000):  # what arrived, without starving the loop
            try:
                datagram = sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                log.warning("front door request log %s: read failed", self.path, exc_info=True)
                return
            logged = parse(datagram)
            if logged is not None:
                self.recent.append(logged)

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(RuntimeError, ValueError):
            asyncio.get_running_loop().remove_reader(sock.fileno())
        sock.close()
        Path(self.path).unlink(missing_ok=True)
