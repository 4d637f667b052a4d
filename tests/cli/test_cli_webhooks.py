"""`epctl webhooks` against a real coordinator process: create (the secret shown once), list, delete,
unknown event types refused, secret rotation with an overlap, replay."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.cli.epctl_runner import epctl
from tests.support.processes import Coordinator


@pytest.fixture
def webhooks_available(api: httpx.Client) -> None:
    if api.get("/v1/webhooks").status_code == 404:
        pytest.skip("the coordinator has no /v1/webhooks router registered")


@pytest.mark.usefixtures("webhooks_available")
def test_webhooks_create_shows_the_secret_once_then_list_and_delete(coordinator: Coordinator) -> None:
    created = epctl(
        coordinator,
        "webhooks",
        "create",
        "https://hooks.example/hook",
        "-e",
        "succeeded",
        "-e",
        "failed",
        "--description",
        "ops channel",
    )
    assert created.exit_code == 0, created.output
    assert "whsec_" in created.stdout
    listed = json.loads(epctl(coordinator, "webhooks", "list", "--json").stdout)
    subscription = next(s for s in listed["data"] if s.get("description") == "ops channel")
    assert set(subscription["event_types"]) == {"reconfiguration.succeeded", "reconfiguration.failed"}
    assert "whsec_" not in json.dumps(subscription)
    deliveries = epctl(coordinator, "webhooks", "deliveries", subscription["id"])
    assert deliveries.exit_code == 0, deliveries.output
    deleted = epctl(coordinator, "webhooks", "delete", subscription["id"])
    assert deleted.exit_code == 0, deleted.output
    remaining = json.loads(epctl(coordinator, "webhooks", "list", "--json").stdout)["data"]
    assert subscription["id"] not in {s["id"] for s in remaining}


def test_webhooks_create_rejects_an_unknown_event_type(coordinator: Coordinator) -> None:
    result = epctl(coordinator, "webhooks", "create", "https://hooks.example/hook", "-e", "exploded")
    assert result.exit_code == 2
    assert "unknown event" in result.output


@pytest.mark.usefixtures("webhooks_available")
def test_webhooks_rotate_secret_with_an_overlap_and_replay(coordinator: Coordinator) -> None:
    created = epctl(coordinator, "webhooks", "create", "https://hooks.example/hook", "--json")
    subscription_id = json.loads(created.stdout)["id"]
    rotated = epctl(coordinator, "webhooks", "rotate-secret", subscription_id, "--overlap", "600")
    assert rotated.exit_code == 0, rotated.output
    assert "whsec_" in rotated.stdout and "old secret signs too until" in rotated.stdout
    replayed = epctl(coordinator, "webhooks", "replay", subscription_id, "--since", "2026-01-01T00:00:00Z")
    assert replayed.exit_code == 0, replayed.output
    assert f"for {subscription_id}" in replayed.stdout
    epctl(coordinator, "webhooks", "delete", subscription_id)
