"""`GET /v1/reconfigurations`: `count` is exact on the first page; the cursor carries it to later pages."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from fastapi.testclient import TestClient

# Counts and cursors follow the database's ordering.
pytestmark = pytest.mark.databases("sqlite", "postgres")


def _finished_jobs(client: TestClient, count: int, deployment: str = "demo") -> list[str]:
    """`count` cancelled jobs of `deployment`, oldest first."""
    body = {"name": deployment, "min_dp_size": 1, "max_dp_size": 4}
    assert client.post("/v1/deployments", json=body).status_code == 201
    ids = []
    for index in range(count):
        job = client.post(
            "/v1/reconfigurations", json={"deployment": deployment, "target_dp_size": 2 + index % 2}
        ).json()
        assert client.post(f"/v1/reconfigurations/{job['id']}/cancel").status_code == 200
        ids.append(job["id"])
    return ids


def _page(client: TestClient, **params: Any) -> Any:
    response = client.get("/v1/reconfigurations", params=params)
    assert response.status_code == 200
    return response.json()


def test_later_pages_repeat_the_first_pages_count(client: TestClient) -> None:
    _finished_jobs(client, 3)
    first = _page(client, limit=2)
    assert first["count"] == 3
    _finished_jobs(client, 1, deployment="later")  # newer than every job on the next page
    assert _page(client, limit=2, cursor=first["next_cursor"])["count"] == 3
    assert _page(client, limit=2)["count"] == 4, "a page without a cursor counts afresh"


def test_a_bare_job_id_cursor_still_pages_and_counts(client: TestClient) -> None:
    ids = _finished_jobs(client, 3)
    bare = base64.urlsafe_b64encode(ids[2].encode()).decode().rstrip("=")
    page = _page(client, cursor=bare)
    assert [job["id"] for job in page["data"]] == ids[1::-1] and page["count"] == 3


def test_a_cursor_used_under_other_filters_counts_for_those_filters(client: TestClient) -> None:
    ids = _finished_jobs(client, 3)
    _finished_jobs(client, 2, deployment="other")
    cursor = _page(client, limit=1)["next_cursor"]
    page = _page(client, deployment="demo", cursor=cursor)
    assert page["count"] == 3 and [job["id"] for job in page["data"]] == ids[::-1]
