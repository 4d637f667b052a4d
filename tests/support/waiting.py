"""Waiting on a real condition, never for a fixed time: `wait_until(predicate, timeout_s=, what=)`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """`wait_until` gave up: the message names the condition and, when asked, the state it saw last."""


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.02,
    describe: Callable[[], str] | None = None,
    alive: Callable[[], bool] | None = None,
) -> T:
    """Call `predicate` until it returns something truthy and return that.

    `alive`: when it turns false (a child died), give up at once. Transport errors count as "not yet":
    a server that is still starting refuses connections. On timeout raise `WaitTimeout` naming `what`
    and, with `describe`, the state seen last (a log tail, the last response)."""
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while True:
        try:
            value = predicate()
            if value:
                return value
        except httpx.TransportError as exc:
            last_error = f" (last error: {type(exc).__name__}: {exc})"
        if alive is not None and not alive():
            raise WaitTimeout(f"gave up waiting for {what}: the process died{last_error}{_tail(describe)}")
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"waited {timeout_s:g} s for {what}{last_error}{_tail(describe)}")
        time.sleep(interval_s)


def _tail(describe: Callable[[], str] | None) -> str:
    if describe is None:
        return ""
    with contextlib.suppress(Exception):
        return "\n" + describe()
    return ""
