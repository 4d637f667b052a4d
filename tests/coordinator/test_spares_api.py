"""Warm spares on the record (issue 38): the `spares` setting, validated (bad input: a 422/400
problem that changes nothing), and the spares a deployment holds on GET deployment, the engines list
and `/metrics`. Keeping them (launch, preload, heal onto them) is the reference backend's: shown on real
processes in tests/e2e/test_spares.py."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient


def _create(client: TestClient, **fields: Any) -> Any:
    return client.post("/v1/deployments", json={"name": "demo", "max_dp_size": 4, **fields})


def _register(client: TestClient, engine_id: str, **heartbeat: Any) -> None:
    url = f"http://{engine_id}:9000"
    body: dict[str, Any] = {"engine_id": engine_id, "deployment": "demo", "url": url, "platform": "cpu"}
    body |= {"device": "cpu", "engine": {}}
    assert client.post("/v1/engines", json=body).status_code == 201
    beat = {"state": "idle", "generation": 0, **heartbeat}
    assert client.post(f"/v1/engines/{engine_id}/heartbeat", json=beat).status_code == 200


def test_a_deployment_keeps_no_spares_unless_asked(client: TestClient) -> None:
    body = _create(client).json()
    assert (body["spares"], body["spare_engines"]) == (0, [])


def test_spares_are_set_on_create_and_changed_by_patch(client: TestClient) -> None:
    assert _create(client, spares=2).json()["spares"] == 2
    response = client.patch("/v1/deployments/demo", json={"spares": 1})
    assert response.status_code == 200 and response.json()["spares"] == 1


@pytest.mark.parametrize("bad", [-1, 17, "1", 1.5])
def test_a_bad_spare_count_is_a_422_problem(client: TestClient, bad: object) -> None:
    response = _create(client, spares=bad)
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/deployments/demo").status_code == 404


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"launcher": "static"}, "launcher that starts engines"),
        ({"backend": "vllm", "launcher": "static", "vllm": {"url": "http://127.0.0.1:1"}}, "reference only"),
    ],
)
def test_spares_where_nothing_can_launch_them_are_refused(
    client: TestClient, fields: dict[str, Any], says: str
) -> None:
    response = _create(client, spares=1, **fields)
    assert response.status_code == 422 and says in response.text
    assert response.headers["content-type"].startswith("application/problem+json")


def test_patching_spares_onto_a_static_deployment_is_refused_and_changes_nothing(client: TestClient) -> None:
    assert _create(client, launcher="static").status_code == 201
    response = client.patch("/v1/deployments/demo", json={"spares": 1})
    assert response.status_code in (400, 422) and response.json()["code"] == "spares-unsupported"
    assert response.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/deployments/demo").json()["spares"] == 0


def test_the_spares_held_show_on_the_deployment_the_engines_and_the_metrics(client: TestClient) -> None:
    assert _create(client, spares=1).status_code == 201
    _register(client, "m0", state="serving", rank=0, world_size=1, generation=1)
    _register(client, "s0")  # idle, never a member: a spare
    _register(client, "s1")  # a second one beyond `spares`: idle, not counted
    _register(client, "b0", broken_generation=1)  # a survivor of a broken group: no spare
    body = client.get("/v1/deployments/demo").json()
    assert body["spare_engines"] == ["s0"]
    roles = {
        e["id"]: e["role"] for e in client.get("/v1/engines", params={"deployment": "demo"}).json()["data"]
    }
    assert roles == {"m0": "member", "s0": "spare", "s1": None, "b0": None}
    metrics = client.get("/metrics").text
    assert 'epctl_deployment_spares{deployment="demo"} 1.0' in metrics
    assert 'epctl_deployment_spares_wanted{deployment="demo"} 1.0' in metrics
