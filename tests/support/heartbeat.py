"""A timestamped line while pytest is quiet: a long collection, fixture or test says what it is doing
and for how long, every `EPCTL_TEST_HEARTBEAT_S` (30 s), so a long run is never a silent wait.

    .venv/bin/python -m pytest -p tests.support.heartbeat ...      # scripts/test loads it

Only the current item is named (tests run one at a time here); between items pytest's own progress
is the sign of life. The lines go to the terminal's stderr as it was when pytest loaded the plugin
(`-p` loads it before output capturing starts), so a captured test does not swallow them.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

# Where the lines go: stderr before pytest captures it (fd 2 is a capture file while a test runs).
_TERMINAL = os.dup(2)


class Heartbeat:
    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.current: tuple[str, float] | None = None  # what runs, since when (monotonic)
        self.last_line = time.monotonic()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pytest-heartbeat", daemon=True)

    def start(self, what: str) -> None:
        self.current = (what, time.monotonic())
        self.last_line = time.monotonic()

    def stop(self) -> None:
        self.current = None

    def _run(self) -> None:
        while not self.stopped.wait(1.0):
            current = self.current
            now = time.monotonic()
            if current is None or now - self.last_line < self.every_s:
                continue
            what, since = current
            self.last_line = now
            line = f"\n[{time.strftime('%H:%M:%S')}] ... still running {what} ({now - since:.0f} s)\n"
            os.write(_TERMINAL, line.encode())

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        self.start("the collection")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.stop()

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self.start(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self.stop()

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.current = None
        self.stopped.set()


def pytest_configure(config: pytest.Config) -> None:
    heartbeat = Heartbeat(float(os.environ.get("EPCTL_TEST_HEARTBEAT_S", "30")))
    config.pluginmanager.register(heartbeat, "epctl-heartbeat")
    heartbeat.thread.start()
