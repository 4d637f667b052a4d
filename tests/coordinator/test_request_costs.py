"""Two per-request costs of issue 37 the coordinator no longer pays: the garbage collector's full passes
over its start-up objects (frozen once started, given back at the stop) and FastAPI's own telemetry
asking, on every request, whether OpenTelemetry is configured."""

from __future__ import annotations

import gc

import pytest
from fastapi.testclient import TestClient

from app.core.config import Settings
from app.main import create_app
from tests.support.processes import ADMIN_TOKEN


@pytest.mark.parametrize("freeze", [True, False])
def test_a_started_coordinator_freezes_its_heap_where_it_owns_the_process(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, freeze: bool
) -> None:
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    app = create_app(settings.model_copy(update={"webhook_worker_enabled": False}), freeze_heap=freeze)
    assert gc.get_freeze_count() == 0
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        assert client.get("/readyz").status_code == 200
        assert (gc.get_freeze_count() > 0) is freeze
    assert gc.get_freeze_count() == 0


def test_fastapis_own_telemetry_is_off(settings: Settings) -> None:
    """No OpenTelemetry here: FastAPI's would otherwise ask the global providers and the environment on
    every request whether it is configured (issue 37: 4% of a heartbeat's CPU)."""
    app = create_app(settings)
    config: dict[str, object] = dict(app._telemetry)
    assert [config[k] for k in ("tracing", "metrics", "logs")] == [False, False, False]
    assert app._native_telemetry.enabled() is False
