"""A line at least every 10 s while a start goes on: `epctl up` on a loaded machine spends tens of
seconds migrating, importing, adopting or waiting for self-healing, and a silent terminal reads as a
hang. A thread, so a step that holds the event loop (or the GIL in a long import) still gets its line
as soon as it lets go."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

EVERY_S = 10.0


class Heartbeat:
    """`doing(what)` names the current step; every `every_s` without another line, one says it is still
    going. `doing(None)` pauses it (a step that prints its own progress); `said()` tells it a line was
    just printed; `stop()` ends it."""

    def __init__(self, prefix: str, echo: Callable[[str], None], every_s: float = EVERY_S) -> None:
        self.prefix = prefix
        self.echo = echo
        self.every_s = every_s
        self._what: str | None = None
        self._started = time.monotonic()
        self._last_line = self._started
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epctl-heartbeat", daemon=True)

    def start(self, what: str) -> Heartbeat:
        self.doing(what)
        self._thread.start()
        return self

    def doing(self, what: str | None) -> None:
        with self._lock:
            self._what = what
            self._last_line = time.monotonic()

    def said(self) -> None:
        with self._lock:
            self._last_line = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        while not self._stopped.wait(self.every_s / 10):
            with self._lock:
                now = time.monotonic()
                if self._what is None or now - self._last_line < self.every_s:
                    continue
                self._last_line = now
                line = f"{self.prefix}: still {self._what} ({now - self._started:.0f} s since the start)"
            self.echo(line)
