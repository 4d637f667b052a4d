"""Every error is application/problem+json; /healthz and /readyz."""

from __future__ import annotations

import json

import pytest
from alembic import command
from fastapi.testclient import TestClient

from app.core.db import alembic_config

PROBLEM_MEMBERS = {"type", "title", "status", "detail", "instance"}
JSON = {"content-type": "application/json"}


def test_unknown_routes_are_404_problems(client: TestClient) -> None:
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404 and response.headers["content-type"] == "application/problem+json"
    assert set(response.json()) >= PROBLEM_MEMBERS and response.json()["instance"] == "/v1/nothing-here"


def test_wrong_methods_are_405_problems_with_allow(client: TestClient) -> None:
    response = client.delete("/healthz")
    assert response.status_code == 405 and response.headers["content-type"] == "application/problem+json"
    assert "GET" in response.headers["allow"]


def test_validation_errors_are_422_problems_listing_each_error(client: TestClient) -> None:
    response = client.post("/v1/deployments", json={"name": 7, "min_dp_size": -1})
    problem = response.json()
    assert response.status_code == 422 and response.headers["content-type"] == "application/problem+json"
    assert {tuple(e["loc"]) for e in problem["errors"]} >= {("body", "name"), ("body", "min_dp_size")}
    assert problem["type"].endswith("validation-error")


def test_query_validation_errors_are_problems_too(client: TestClient) -> None:
    response = client.get("/v1/reconfigurations", params={"state": "sleeping"})
    assert response.status_code == 422 and response.headers["content-type"] == "application/problem+json"


def test_healthz_answers_without_a_token(client: TestClient) -> None:
    response = client.get("/healthz", headers={"Authorization": ""})
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_is_ready_on_a_migrated_database(client: TestClient) -> None:
    assert client.get("/readyz").json() == {"status": "ready"}


def test_readyz_is_503_when_the_schema_is_not_at_head(client: TestClient, database_url: str) -> None:
    command.downgrade(alembic_config(database_url), "base")
    response = client.get("/readyz")
    assert response.status_code == 503 and response.headers["content-type"] == "application/problem+json"
    assert "migration" in response.json()["detail"]


@pytest.mark.databases("sqlite", "postgres")
def test_a_nul_character_in_input_is_a_4xx_problem_and_changes_nothing(client: TestClient) -> None:
    # Postgres refuses NUL in text; SQLite stores it. Either way the answer is never a 500.
    before = client.get("/v1/reconfigurations").json()["count"]
    for response in (
        client.post("/v1/reconfigurations", json={"deployment": "a\u0000b", "target_dp_size": 2}),
        client.get("/v1/reconfigurations", params={"deployment": "a\u0000b"}),
    ):
        assert 400 <= response.status_code < 500, response.text
        assert response.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/reconfigurations").json()["count"] == before


@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_a_json_body_sent_without_saying_so_is_a_415_that_names_the_header(
    client: TestClient, content_type: str | None
) -> None:
    body = b'{"name": "demo", "launcher": "static"}'
    headers = {"content-type": content_type} if content_type else {}
    request = client.build_request("POST", "/v1/deployments", content=body, headers=headers)
    assert request.headers.get("content-type") == content_type  # raw bytes: httpx adds none
    response = client.send(request)
    assert response.status_code == 415 and response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "unsupported-media-type"
    assert "Content-Type: application/json" in problem["detail"]
    assert f"(this one: {content_type or 'none'})" in problem["detail"]
    assert client.get("/v1/deployments").json()["count"] == 0


def test_a_missing_body_is_still_a_422_naming_the_body(client: TestClient) -> None:
    response = client.post("/v1/deployments")
    assert response.status_code == 422 and response.json()["errors"][0]["loc"] == ["body"]


def test_every_problem_body_has_one_style_whoever_answers(client: TestClient) -> None:
    """The input limits answer ahead of the app; their bodies are written as the app's own are: the same
    members in the same order, the same JSON encoding, the same title for a 422 about the request."""
    by_the_gate = client.post("/v1/deployments", content=b"[" * 100 + b"]" * 100, headers=JSON)
    by_the_app = client.post("/v1/deployments", json={"name": "Not A Slug"})
    by_a_route = client.get("/v1/nowhere")
    for response, status in ((by_the_gate, 422), (by_the_app, 422), (by_a_route, 404)):
        assert (
            response.status_code == status and response.headers["content-type"] == "application/problem+json"
        )
        body = response.json()
        assert list(body)[:6] == ["type", "title", "status", "detail", "instance", "code"]
        assert response.content == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    assert by_the_gate.json()["title"] == by_the_app.json()["title"] == "Request validation failed"
    assert by_a_route.json()["title"] == "Not found"  # sentence case, as the domain errors' titles
