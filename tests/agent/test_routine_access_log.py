"""Routine calls that succeed (heartbeats, health probes) stay out of the access log; everything else,
and every failure of them, stays in (`engine_agent.logs.is_routine_access`, `RoutineAccessFilter`)."""

from __future__ import annotations

import io
import logging

import pytest

from engine_agent.logs import QUIET_LOGGERS, RoutineAccessFilter, configure_logging, is_routine_access


@pytest.mark.parametrize(
    ("method", "path", "status", "routine"),
    [
        ("POST", "/v1/engines/e-12/heartbeat", 200, True),
        ("POST", "/v1/engines/e-12/heartbeat?x=1", 200, True),
        ("POST", "/v1/engines/e-12/heartbeat", 401, False),  # a refused key is news
        ("POST", "/v1/engines/e-12/heartbeat", 503, False),
        ("GET", "/v1/engines/e-12/heartbeat", 200, False),  # not the call agents make
        ("POST", "/v1/engines/e-12/heartbeats", 200, False),
        ("POST", "/v1/engines/a/b/heartbeat", 200, False),
        ("GET", "/healthz", 200, True),
        ("GET", "/readyz", 200, True),
        ("GET", "/readyz", 503, False),  # not ready: news
        ("GET", "/livez", 204, True),
        ("GET", "/healthz/extra", 200, False),
        ("POST", "/v1/reconfigurations", 201, False),
        ("GET", "/v1/deployments", 200, False),
    ],
)
def test_which_access_lines_are_routine(method: str, path: str, status: int, routine: bool) -> None:
    assert is_routine_access(method, path, status) is routine


def test_configure_logging_filters_uvicorns_access_log_once() -> None:
    stream = io.StringIO()
    access = logging.getLogger("uvicorn.access")
    root = logging.getLogger()
    before = list(access.filters)
    # What configure_logging changes, put back after: later tests in this process log through them.
    root_before = (root.level, list(root.handlers))
    quiet_before = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    try:
        configure_logging("text", logging.INFO, stream)
        configure_logging("text", logging.INFO, stream)  # idempotent: one filter, not two
        assert sum(isinstance(f, RoutineAccessFilter) for f in access.filters) == 1
        line = '%s - "%s %s HTTP/%s" %d'
        access.info(line, "127.0.0.1:5", "POST", "/v1/engines/e1/heartbeat", "1.1", 200)
        access.info(line, "127.0.0.1:5", "POST", "/v1/engines/e1/heartbeat", "1.1", 401)
        access.info(line, "127.0.0.1:5", "GET", "/v1/deployments", "1.1", 200)
        access.info("not uvicorn's shape: %s", "kept")
        logged = stream.getvalue()
        assert 'heartbeat HTTP/1.1" 200' not in logged
        assert 'heartbeat HTTP/1.1" 401' in logged
        assert "/v1/deployments" in logged and "kept" in logged
    finally:
        for added in [f for f in access.filters if f not in before]:
            access.removeFilter(added)
        root.setLevel(root_before[0])
        root.handlers[:] = root_before[1]
        for name, level in quiet_before.items():
            logging.getLogger(name).setLevel(level)
