"""An ASGI app served over real HTTP (uvicorn in a thread) for a test: for clients that need a socket
(the coordinator's aiohttp agent client has no in-process transport)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.support.processes import free_port
from tests.support.waiting import wait_until

Serve = Callable[[Any], str]


@contextlib.contextmanager
def served(app: Any, *, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """`app` listening on a free loopback port; yields its base URL, stops it on exit. `tls`: the
    (certificate, key) PEM files to serve HTTPS with."""
    port = free_port()
    certificate, key = (str(tls[0]), str(tls[1])) if tls else (None, None)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        # Neither: each reconfigures the process's loggers for good (uvicorn's dictConfig leaves
        # `uvicorn.access` at WARNING with propagate off), and a later test of the logging set-up
        # would find them so. Its loggers propagate to the root logger, as the test's own do.
        log_config=None,
        log_level=None,
        lifespan="off",
        # A request still in flight at the end of a test (a handler that outlasts its client's deadline,
        # a long poll) is cancelled after this (s), instead of holding the stop until it ends.
        timeout_graceful_shutdown=1,
        ssl_certfile=certificate,
        ssl_keyfile=key,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"served-{port}", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout_s=10.0, what=f"a test server on port {port}")
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5.0)


@pytest.fixture
def serve_app() -> Iterator[Serve]:
    """`serve_app(app)` -> its URL; every app served is stopped at the end of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda app: stack.enter_context(served(app))
