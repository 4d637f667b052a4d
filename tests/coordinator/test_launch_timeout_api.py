"""A deployment's launch readiness timeout on the record (issue 34): `launch_timeout_s`, set on create,
changed and cleared (explicit null: adaptive again) by PATCH, shown on GET, validated (a bad value is a
422 problem that changes nothing). How a launch uses it: tests/runner/test_launch_readiness.py (the rule)
and tests/runner/test_launch_timeout_flow.py (a job hands it to its launcher)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient


def _create(client: TestClient, **fields: Any) -> Any:
    return client.post("/v1/deployments", json={"name": "demo", "max_dp_size": 4, **fields})


def test_a_deployment_without_a_launch_timeout_is_adaptive(client: TestClient) -> None:
    assert _create(client).json()["launch_timeout_s"] is None


def test_the_launch_timeout_is_set_on_create_changed_and_cleared_by_patch(client: TestClient) -> None:
    assert _create(client, launch_timeout_s=180).json()["launch_timeout_s"] == 180.0
    assert client.get("/v1/deployments/demo").json()["launch_timeout_s"] == 180.0
    response = client.patch("/v1/deployments/demo", json={"launch_timeout_s": 90.5})
    assert response.status_code == 200 and response.json()["launch_timeout_s"] == 90.5
    response = client.patch("/v1/deployments/demo", json={"min_dp_size": 1})  # not named: kept
    assert response.json()["launch_timeout_s"] == 90.5
    response = client.patch("/v1/deployments/demo", json={"launch_timeout_s": None})
    assert response.status_code == 200 and response.json()["launch_timeout_s"] is None


@pytest.mark.parametrize("bad", [0, 0.5, -1, 3601, "60", True])
def test_a_bad_launch_timeout_is_a_422_problem_that_changes_nothing(client: TestClient, bad: object) -> None:
    response = _create(client, launch_timeout_s=bad)
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "launch_timeout_s" in response.text
    assert client.get("/v1/deployments/demo").status_code == 404
    assert _create(client, launch_timeout_s=120).status_code == 201
    response = client.patch("/v1/deployments/demo", json={"launch_timeout_s": bad})
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/deployments/demo").json()["launch_timeout_s"] == 120.0
