"""A started coordinator keeps its start-up objects out of the garbage collector's full passes (issue 37:
each full pass walked them all, a fifth of a heartbeat's CPU at 700 a second); a stopped one gives them
back."""

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
