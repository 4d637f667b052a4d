"""`/v1/deployments`: admin-configured, validated, deletable only when idle."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.support.fixtures import token_headers

DEMO = {"name": "demo", "min_dp_size": 1, "max_dp_size": 4}


def test_create_answers_201_with_location_and_defaults(client: TestClient) -> None:
    response = client.post("/v1/deployments", json=DEMO)
    assert response.status_code == 201
    assert response.headers["location"] == "/v1/deployments/demo"
    body = response.json()
    assert (body["current_dp_size"], body["generation"], body["warmup_policy"]) == (0, 0, "auto")
    assert body["strategy"] == "background" and body["launcher"] == "local"
    assert body["engine"]["num_logical_experts"] == 16 and body["autoscale_cooldown_s"] == 60


def test_a_taken_name_is_409(client: TestClient) -> None:
    client.post("/v1/deployments", json=DEMO)
    response = client.post("/v1/deployments", json=DEMO)
    assert response.status_code == 409 and response.json()["code"] == "deployment-exists"


def test_min_above_max_is_422_problem(client: TestClient) -> None:
    response = client.post("/v1/deployments", json={"name": "x", "min_dp_size": 5, "max_dp_size": 2})
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/deployments").json()["count"] == 0


def test_top_k_above_the_expert_count_is_422_problem(client: TestClient) -> None:
    engine = {"num_logical_experts": 4, "top_k": 5}
    response = client.post("/v1/deployments", json={"name": "x", "engine": engine})
    assert response.status_code == 422 and response.json()["code"] == "validation-error"
    assert "top_k (5) must not exceed num_logical_experts (4)" in response.text
    assert client.get("/v1/deployments").json()["count"] == 0
    engine["top_k"] = 4  # every expert: still a valid layer
    assert client.post("/v1/deployments", json={"name": "x", "engine": engine}).status_code == 201


def test_names_must_be_slugs(client: TestClient) -> None:
    assert client.post("/v1/deployments", json={"name": "Not A Slug"}).status_code == 422


def test_update_changes_limits_and_warmup_policy(client: TestClient) -> None:
    client.post("/v1/deployments", json=DEMO)
    response = client.patch("/v1/deployments/demo", json={"max_dp_size": 6, "warmup_policy": "deferred"})
    assert response.status_code == 200
    assert (response.json()["max_dp_size"], response.json()["warmup_policy"]) == (6, "deferred")


def test_update_refuses_min_above_the_existing_max(client: TestClient) -> None:
    client.post("/v1/deployments", json=DEMO)
    response = client.patch("/v1/deployments/demo", json={"min_dp_size": 5})
    assert response.status_code == 422 and response.json()["code"] == "invalid-limits"


def test_delete_works_when_idle(client: TestClient) -> None:
    client.post("/v1/deployments", json=DEMO)
    assert client.delete("/v1/deployments/demo").status_code == 204
    assert client.get("/v1/deployments/demo").status_code == 404


def test_delete_is_refused_while_a_job_is_active(client: TestClient) -> None:
    client.post("/v1/deployments", json=DEMO)
    job = client.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2}).json()
    response = client.delete("/v1/deployments/demo")
    assert response.status_code == 409 and response.json()["active_job_id"] == job["id"]


def test_get_shows_the_active_job(client: TestClient) -> None:
    client.post("/v1/deployments", json=DEMO)
    job = client.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2}).json()
    assert client.get("/v1/deployments/demo").json()["active_job_id"] == job["id"]


def test_configuration_needs_admin(client: TestClient) -> None:
    operator = token_headers(client, "operator")
    assert client.post("/v1/deployments", json=DEMO, headers=operator).status_code == 403
    client.post("/v1/deployments", json=DEMO)
    assert client.patch("/v1/deployments/demo", json={"max_dp_size": 2}, headers=operator).status_code == 403
    assert client.get("/v1/deployments", headers=operator).status_code == 200


def test_autoscaling_behaviour_defaults_to_hpas_and_updates_field_by_field(client: TestClient) -> None:
    created = client.post("/v1/deployments", json={"name": "hpa"}).json()
    unset = {"max_step": None, "period_s": 60.0, "policies": None, "select_policy": "Max"}
    assert created["autoscale_behavior"] == {
        "scale_down": {"stabilization_window_s": 300.0, **unset},
        "scale_up": {"stabilization_window_s": 0.0, **unset},
    }
    assert created["autoscale_paused"] is False
    body = {"autoscale_behavior": {"scale_up": {"max_step": 2}}, "autoscale_paused": True}
    updated = client.patch("/v1/deployments/hpa", json=body).json()
    assert updated["autoscale_behavior"]["scale_up"] == {
        "stabilization_window_s": 0.0,
        **unset,
        "max_step": 2,
    }
    assert updated["autoscale_behavior"]["scale_down"]["stabilization_window_s"] == 300.0
    assert updated["autoscale_paused"] is True
    # HPA's Percent policies and selectPolicy (issue 36).
    percent = {"type": "Percent", "value": 50, "period_s": 30.0}
    body = {"autoscale_behavior": {"scale_down": {"policies": [percent], "select_policy": "Min"}}}
    down = client.patch("/v1/deployments/hpa", json=body).json()["autoscale_behavior"]["scale_down"]
    assert (down["policies"], down["select_policy"], down["stabilization_window_s"]) == (
        [percent],
        "Min",
        300.0,
    )
    body = {"autoscale_behavior": {"scale_down": {"policies": None, "select_policy": "Disabled"}}}
    down = client.patch("/v1/deployments/hpa", json=body).json()["autoscale_behavior"]["scale_down"]
    assert (down["policies"], down["select_policy"]) == (None, "Disabled")


@pytest.mark.parametrize(
    "behavior",
    [
        {"scale_down": {"stabilization_window_s": -1}},
        {"scale_down": {"stabilization_window_s": 3601}},
        {"scale_up": {"max_step": 0}},
        {"scale_up": {"period_s": 0}},
        {"scale_up": {"colour": "red"}},
        {"sideways": {}},
        {"scale_up": {"policies": [{"type": "Replicas", "value": 1, "period_s": 15}]}},
        {"scale_up": {"select_policy": "Largest"}},
    ],
)
def test_a_behaviour_out_of_bounds_is_422_and_changes_nothing(
    client: TestClient, behavior: dict[str, Any]
) -> None:
    client.post("/v1/deployments", json={"name": "hpa"})
    response = client.patch("/v1/deployments/hpa", json={"autoscale_behavior": behavior})
    assert response.status_code == 422 and response.headers["content-type"] == "application/problem+json"
    assert (
        client.get("/v1/deployments/hpa").json()["autoscale_behavior"]["scale_down"]["stabilization_window_s"]
        == 300
    )


def test_the_list_is_paginated_by_name_like_the_job_list(client: TestClient) -> None:
    names = [f"d{i:02d}" for i in (4, 0, 3, 1, 2)]
    for name in names:
        assert client.post("/v1/deployments", json={"name": name}).status_code == 201
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 2}
    pages = 0
    while True:
        page = client.get("/v1/deployments", params=params).json()
        pages += 1
        assert page["count"] == 5 and len(page["data"]) <= 2
        seen += [d["name"] for d in page["data"]]
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert seen == sorted(names) and pages == 3
    refused = client.get("/v1/deployments", params={"cursor": "not a cursor!"})
    assert refused.status_code == 422 and refused.json()["code"] == "invalid-cursor"
    assert client.get("/v1/deployments", params={"limit": 201}).status_code == 422


def test_a_page_is_read_in_the_same_number_of_queries_however_many_deployments(client: TestClient) -> None:
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "api_tokens" not in statement:  # the caller's token lookup (cached, or not) is not the list's
            statements.append(statement)

    def queries_for_one_page() -> int:
        statements.clear()
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", count)
        try:
            assert client.get("/v1/deployments", params={"limit": 200}).status_code == 200
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", count)
        return len(statements)

    for i in range(3):
        client.post("/v1/deployments", json={"name": f"few-{i}"})
    few = queries_for_one_page()
    for i in range(30):
        client.post("/v1/deployments", json={"name": f"many-{i}"})
    assert client.get("/v1/deployments").json()["count"] == 33
    many = queries_for_one_page()
    # 8: the front doors (issue 35) are one more query, partial grows' standing targets (issue 38) one more
    assert many == few <= 8, statements
