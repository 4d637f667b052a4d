from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _api_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """These tests exercise the API and the state machine; no background worker moves their jobs."""
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    monkeypatch.setenv("EPCTL_WEBHOOK_WORKER_ENABLED", "false")
    yield
