"""An ASGI app served over real HTTP (uvicorn in a thread) for a test: for clients that need a socket
(the coordinator's aiohttp agent client has no in-process transport)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from tests.support.processes import free_port
from tests.support.waiting import wait_until

Serve = Callable[[Any], str]


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """`app` listening on a free loopback port; yields its base URL, stops it on exit."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name=f"served-{port}", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout_s=10.0, what=f"a test server on port {port}")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5.0)


@pytest.fixture
def serve_app() -> Iterator[Serve]:
    """`serve_app(app)` -> its URL; every app served is stopped at the end of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda app: stack.enter_context(served(app))
