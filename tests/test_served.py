"""The harness's server in a thread (`tests/support/served.py`) leaves the process's logging as it
found it: tests run in one process, and a later test of the logging set-up (tests/agent's access-log
filter) must not find uvicorn's loggers reconfigured by an earlier test that served an app; and its stop
does not wait for a request still in flight (a handler past its client's deadline, a long poll)."""

from __future__ import annotations

import asyncio
import logging
import threading

import httpx
from fastapi import FastAPI

from tests.support.served import served

UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def _state() -> dict[str, tuple[object, ...]]:
    return {
        name: (logger.level, logger.propagate, logger.disabled, tuple(logger.handlers))
        for name in UVICORN_LOGGERS
        for logger in [logging.getLogger(name)]
    }


def test_serving_an_app_leaves_uvicorns_loggers_as_they_were() -> None:
    app = FastAPI()
    app.get("/ping")(lambda: {"ok": True})
    before = _state()
    with served(app) as url:
        assert httpx.get(f"{url}/ping").json() == {"ok": True}
    assert _state() == before


def test_a_request_still_in_flight_does_not_hold_the_stop() -> None:
    app = FastAPI()
    entered = threading.Event()

    @app.get("/hang")
    async def hang() -> dict[str, bool]:
        entered.set()
        await asyncio.Event().wait()  # never set: only the server's stop ends it
        return {"ok": True}

    outcome: list[object] = []

    def call(url: str) -> None:
        try:
            outcome.append(httpx.get(f"{url}/hang", timeout=60).status_code)
        except httpx.HTTPError as error:
            outcome.append(type(error).__name__)

    with served(app) as url:
        port = url.rsplit(":", 1)[1]
        client = threading.Thread(target=call, args=(url,), daemon=True)
        client.start()
        assert entered.wait(timeout=30), "the request never reached its handler"
    # The server's thread ended within the stop's own wait, cutting the request off.
    assert not [t for t in threading.enumerate() if t.name == f"served-{port}"]
    client.join(timeout=30)
    assert outcome and outcome != [200], outcome  # cut off: an error or a 500, never its answer
