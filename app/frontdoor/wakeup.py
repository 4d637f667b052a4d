"""A wake-up for feed watchers in this process: `refresh` rings it (from any thread) when it writes a
version, so a watch or the keeper answers at once; changes written by another coordinator are found by
the watchers' own polling."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class FeedSignal:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[asyncio.Future[None]] = set()

    def ring(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    async def wait(self, timeout_s: float) -> bool:
        """Until the next ring or `timeout_s`; whether it rang."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._waiters.add(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                self._waiters.discard(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


FEED_CHANGED = FeedSignal()
FEED_APPLIED = FeedSignal()  # a keeper applied a version (a job waiting for its front door wakes)


class Publishing:
    """Whether this process runs the feeds' publisher (`app.frontdoor.keeper.publish_feeds`)."""

    running = False


PUBLISHING = Publishing()
