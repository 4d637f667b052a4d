"""`commit` on a reconfiguration: engine-agreed by default, the coordinator's two-step commit on
request (and for the blocking strategy); an impossible combination is a 422 that changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient


def _deployment(client: TestClient, **fields: Any) -> None:
    body = {"name": "demo", "min_dp_size": 1, "max_dp_size": 4, **fields}
    assert client.post("/v1/deployments", json=body).status_code == 201


def _scale(client: TestClient, **fields: Any) -> Any:
    return client.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2, **fields})


def test_a_job_commits_through_the_engines_by_default(client: TestClient) -> None:
    _deployment(client)
    response = _scale(client)
    assert response.status_code == 202
    assert response.json()["commit"] == "engines"


def test_the_coordinators_two_step_commit_is_a_per_job_choice(client: TestClient) -> None:
    _deployment(client)
    assert _scale(client, commit="coordinator").json()["commit"] == "coordinator"


def test_the_blocking_strategy_commits_through_the_coordinator(client: TestClient) -> None:
    _deployment(client, strategy="blocking")
    assert _scale(client).json()["commit"] == "coordinator"


def test_engine_agreed_commit_with_the_blocking_strategy_is_refused(client: TestClient) -> None:
    _deployment(client)
    response = _scale(client, strategy="blocking", commit="engines")
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "commit-mode-unsupported"
    assert client.get("/v1/reconfigurations").json()["count"] == 0


def test_an_unknown_commit_mode_is_a_422(client: TestClient) -> None:
    _deployment(client)
    response = _scale(client, commit="sometimes")
    assert response.status_code == 422
    assert client.get("/v1/reconfigurations").json()["count"] == 0


# --- the downtime budget (`max_downtime_ms`) ---------------------------------------------------------


def test_a_deployment_has_no_downtime_budget_unless_given(client: TestClient) -> None:
    _deployment(client)
    assert client.get("/v1/deployments/demo").json()["max_downtime_ms"] is None
    assert _scale(client).json()["max_downtime_ms"] is None


def test_a_job_takes_the_deployments_budget_unless_it_names_its_own(client: TestClient) -> None:
    _deployment(client, max_downtime_ms=250)
    first = _scale(client).json()
    assert first["max_downtime_ms"] == 250
    client.post(f"/v1/reconfigurations/{first['id']}/cancel")
    assert _scale(client, max_downtime_ms=40).json()["max_downtime_ms"] == 40


def test_an_explicit_null_turns_the_deployments_budget_off(client: TestClient) -> None:
    _deployment(client, max_downtime_ms=250)
    response = client.patch("/v1/deployments/demo", json={"max_downtime_ms": None})
    assert response.status_code == 200, response.text
    assert response.json()["max_downtime_ms"] is None
    assert client.patch("/v1/deployments/demo", json={"max_downtime_ms": 90}).json()["max_downtime_ms"] == 90


@pytest.mark.parametrize("bad", [0, -5, 3_600_001, 2.5, "100", True])
def test_a_bad_budget_is_a_422_problem_that_changes_nothing(client: TestClient, bad: object) -> None:
    _deployment(client)
    on_job = _scale(client, max_downtime_ms=bad)
    assert on_job.status_code == 422
    assert on_job.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/reconfigurations").json()["count"] == 0
    on_deployment = client.patch("/v1/deployments/demo", json={"max_downtime_ms": bad})
    assert on_deployment.status_code == 422
    assert on_deployment.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/deployments/demo").json()["max_downtime_ms"] is None
    created = client.post(
        "/v1/deployments", json={"name": "other", "min_dp_size": 1, "max_dp_size": 2, "max_downtime_ms": bad}
    )
    assert created.status_code == 422
