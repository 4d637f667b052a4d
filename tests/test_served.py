"""The harness's server in a thread (`tests/support/served.py`) leaves the process's logging as it
found it: tests run in one process, and a later test of the logging set-up (tests/agent's access-log
filter) must not find uvicorn's loggers reconfigured by an earlier test that served an app."""

from __future__ import annotations

import logging

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
