"""The coordinator's Kubernetes face (`app.scale.kube`): discovery documents kubectl and client-go read,
`epctl.io/v1` deployments and their scale, and errors on those paths as `v1` `Status` objects (problem+json
everywhere else)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.scale.kube.objects import wants_table

GROUP = "/apis/epctl.io/v1"
SCALE = f"{GROUP}/namespaces/default/deployments/demo/scale"


def _demo(client: TestClient) -> None:
    assert client.post("/v1/deployments", json={"name": "demo", "max_dp_size": 4}).status_code == 201


def test_discovery_names_one_group_with_deployments_and_their_scale(client: TestClient) -> None:
    assert (
        client.get("/api", headers={"Authorization": ""}).json()["versions"] == []
    )  # open, as the API server's
    groups = client.get("/apis").json()
    assert [g["name"] for g in groups["groups"]] == ["epctl.io"]
    assert groups["groups"][0]["preferredVersion"]["groupVersion"] == "epctl.io/v1"
    resources = {r["name"]: r for r in client.get(GROUP).json()["resources"]}
    assert resources["deployments"]["namespaced"] and resources["deployments"]["kind"] == "Deployment"
    scale = resources["deployments/scale"]
    assert (scale["group"], scale["version"], scale["kind"]) == ("autoscaling", "v1", "Scale")
    assert sorted(scale["verbs"]) == ["get", "patch", "update"]
    assert client.get("/version").json()["gitVersion"].startswith("v")


def test_deployments_as_objects_and_as_a_table(client: TestClient) -> None:
    _demo(client)
    listed = client.get(f"{GROUP}/namespaces/default/deployments").json()
    assert listed["kind"] == "DeploymentList" and [i["metadata"]["name"] for i in listed["items"]] == ["demo"]
    assert client.get(f"{GROUP}/namespaces/other/deployments").json()["items"] == []
    table = client.get(
        f"{GROUP}/deployments",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"},
    ).json()
    assert table["kind"] == "Table" and table["rows"][0]["cells"][:5] == ["demo", 0, 0, 0, "ready"]


def test_errors_under_apis_are_status_objects(client: TestClient) -> None:
    _demo(client)
    metadata = {"name": "demo", "resourceVersion": "x"}
    stale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": metadata, "spec": {"replicas": 2}}
    conflict = client.put(SCALE, json=stale)
    assert conflict.status_code == 409 and conflict.headers["content-type"] == "application/json"
    status = conflict.json()
    assert (status["kind"], status["status"], status["reason"], status["code"]) == (
        "Status",
        "Failure",
        "Conflict",
        409,
    )
    assert "has been modified" in status["message"]
    assert status["details"]["causes"][0]["reason"] == "scale-resource-version-conflict"
    assert status["details"]["name"] == "demo"
    unauthenticated = client.get(SCALE, headers={"Authorization": ""})
    assert unauthenticated.status_code == 401 and unauthenticated.json()["reason"] == "Unauthorized"
    assert client.get(f"{GROUP}/namespaces/default/deployments/nope").json()["reason"] == "NotFound"
    assert client.get("/apis/nothing/v9").json()["reason"] == "NotFound"
    assert client.put(SCALE, content=b"{}", headers={"content-type": "text/plain"}).json()["reason"] == (
        "UnsupportedMediaType"
    )
    # The same refusal on the coordinator's own path stays problem+json.
    problem = client.put("/v1/deployments/demo/scale", json=stale)
    assert problem.headers["content-type"] == "application/problem+json"


def test_a_namespace_in_the_body_must_match_the_path(client: TestClient) -> None:
    _demo(client)
    body = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "demo", "namespace": "x"},
            "spec": {"replicas": 2}}  # fmt: skip
    refused = client.put(SCALE, json=body)
    assert refused.status_code == 422 and refused.json()["reason"] == "Invalid"


def test_the_table_is_asked_for_by_kubectls_accept_header() -> None:
    assert wants_table(
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io"
    )
    assert not wants_table("application/json")
