"""Database access for request handlers that cannot starve the connection pool.

Every handler is `async` and does its database work through `Database.run(work)`: `work(session)` runs
in a worker thread with a session of its own, opened and closed inside that one call. So a connection
is held only while a thread is running on it, never while a request waits for a thread (the lock-up of
issue 17: requests holding a connection queued for a thread, threads queued for a connection). At most
`concurrency` calls run at once (an anyio limiter, sized below the pool so background workers keep
connections of their own); the rest wait for a slot without holding anything.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TypeVar

import anyio
from sqlalchemy.engine import Engine
from sqlmodel import Session

T = TypeVar("T")


class Database:
    def __init__(self, engine: Engine, *, concurrency: int) -> None:
        self.engine = engine
        self.concurrency = concurrency
        # One limiter per event loop (a server runs one; an in-process test client may run several).
        self._limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        loop = asyncio.get_running_loop()
        limiter = self._limiters.get(loop)
        if limiter is None:
            limiter = self._limiters[loop] = anyio.CapacityLimiter(self.concurrency)
        return limiter

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    async def run(self, work: Callable[[Session], T]) -> T:
        """`work(session)` in a worker thread; the session (and its connection) ends with the call."""

        def call() -> T:
            with self.session() as session:
                return work(session)

        return await anyio.to_thread.run_sync(call, limiter=self.limiter)
