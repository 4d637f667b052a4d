"""Keeps the `processes` marker true: a test that starts a process (a `subprocess.Popen`, which asyncio's
subprocesses and Playwright's browser use too, or a `multiprocessing` process) in its set-up, call or
tear-down fails unless it is marked `@pytest.mark.processes` (on the test, its class or its module).

So `-m "not processes"` (`scripts/test --fast`) is exactly the in-process tier, and a test that starts
an agent, a coordinator, a server or a browser cannot hide in it."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Generator
from typing import Any

import pytest

MARKER = "processes"
_RECORD = os.environ.get("EPCTL_PROCESS_GUARD_RECORD")  # a file: list unmarked starters there instead
_started = [0]  # processes started by this pytest process so far


def _counting(original: Any) -> Any:
    def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        _started[0] += 1
        return original(self, *args, **kwargs)

    return start


subprocess.Popen.__init__ = _counting(subprocess.Popen.__init__)  # type: ignore[method-assign]
multiprocessing.process.BaseProcess.start = _counting(  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start
)


def _checked(item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
    before = _started[0]
    outcome = yield
    if _started[0] > before and item.get_closest_marker(MARKER) is None:
        if _RECORD:  # listing, not failing: which tests of a run would need the marker
            with open(_RECORD, "a") as record:
                record.write(f"{item.nodeid}\n")
            return outcome
        pytest.fail(
            f"{item.nodeid} started {_started[0] - before} process(es) in its {phase} without "
            f"@pytest.mark.{MARKER}: mark it (or its module), so that `-m 'not {MARKER}'` stays in-process",
            pytrace=False,
        )
    return outcome


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _checked(item, "set-up"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _checked(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    return (yield from _checked(item, "tear-down"))
