"""Wake-ups for the runner's periodic work: news the request side hears that a periodic task must judge
at once, not at its next interval (issue 34: a member's heartbeat reports its group broke, and the
deployment read `ready` with fewer engines serving until the liveness pass came round, up to a second).

The request side `ring`s a task by name; every runner of this process that `listen`s runs that task at
its next loop turn (the loop waits on its bell instead of sleeping its poll interval). Best effort and
process-local: a coordinator that does not hear it (another replica took the heartbeat) judges at its
interval, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

LIVENESS = "liveness"  # the reference engines' liveness pass (`Periodic` name)

Listener = Callable[[str], None]

_lock = threading.Lock()
_listeners: dict[int, tuple[asyncio.AbstractEventLoop, Listener]] = {}


def listen(listener: Listener) -> Callable[[], None]:
    """Call `listener(task)` on the running loop for every ring; returns the call that stops it."""
    loop = asyncio.get_running_loop()
    key = id(listener)
    with _lock:
        _listeners[key] = (loop, listener)

    def stop() -> None:
        with _lock:
            _listeners.pop(key, None)

    return stop


def ring(task: str) -> None:
    """Wake every listening runner for `task` (from any thread; a closed loop is skipped)."""
    with _lock:
        targets = list(_listeners.values())
    for loop, listener in targets:
        if not loop.is_closed():
            loop.call_soon_threadsafe(listener, task)


class Bell:
    """A runner's end of the wake-ups: the tasks rung since it last looked, and a wait that a ring
    ends early."""

    def __init__(self) -> None:
        self._rung: set[str] = set()
        self._event = asyncio.Event()
        self._stop: Callable[[], None] | None = None

    def start(self) -> None:
        self._stop = listen(self._heard)

    def close(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

    def _heard(self, task: str) -> None:
        self._rung.add(task)
        self._event.set()

    async def wait(self, timeout_s: float) -> None:
        """Sleep `timeout_s`, or less when a ring comes."""
        if not self._rung:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout_s)
        self._event.clear()

    def take(self) -> set[str]:
        """The tasks rung since the last look (and forget them)."""
        rung, self._rung = self._rung, set()
        return rung


__all__ = ["LIVENESS", "Bell", "listen", "ring"]
