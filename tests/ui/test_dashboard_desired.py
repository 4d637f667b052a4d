"""The dashboard shows each deployment's desired size: who asked for it, what it waits for, and when the
next scale may start (its own module: its coordinator holds a desire no other test expects)."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from tests.support.job_driver import create_static_deployment
from tests.support.processes import Coordinator
from tests.ui.conftest import screenshot


def test_a_deferred_desired_size_shows_with_what_it_waits_for(page: Any, coordinator: Coordinator) -> None:
    with coordinator.client() as api:
        create_static_deployment(api, "gamma", engines=4)
        api.post("/v1/reconfigurations", json={"deployment": "gamma", "target_dp_size": 3}).raise_for_status()
        scale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 4}}
        assert api.put("/v1/deployments/gamma/scale", json=scale).status_code == 200
    page.goto("/ui/")
    row = page.locator("#deployments-body tr", has_text="gamma")
    expect(row).to_contain_text("active job")
    expect(row).to_contain_text("scale-subresource")
    cells = row.locator("td").all_inner_texts()
    assert cells == [
        "gamma",
        "0",
        "\u2013",  # no spares kept
        "4",
        "scale-subresource (admin-env)",
        "active job",
        "after the active job and its cooldown",
    ]
    screenshot(page, "deployments-desired")
