"""The `kubernetes` Python client's generated `AppsV1Api` scale methods, unmodified, against the
coordinator served over loopback HTTP (uvicorn in a thread of this process): `read_`, `replace_` and
`patch_namespaced_deployment_scale` send what they send (`replace_` a PUT with no Content-Type, `patch_`
a strategic merge patch for an object body, a JSON patch for a list) to the `apps/v1` path, which the
coordinator serves as the same subresource as `/v1/deployments/{name}/scale`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.support.processes import ADMIN_TOKEN
from tests.support.served import served


def _body(error: ApiException) -> Any:
    return json.loads(error.body or "{}")


@pytest.fixture
def apps(client: TestClient) -> Iterator[k8s.AppsV1Api]:
    assert client.post("/v1/deployments", json={"name": "demo", "max_dp_size": 4}).status_code == 201
    with served(client.app) as url:
        configuration = k8s.Configuration(host=url)
        configuration.api_key = {"BearerToken": ADMIN_TOKEN}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        with k8s.ApiClient(configuration) as api:
            yield k8s.AppsV1Api(api)


def test_replace_without_content_type_scales(apps: k8s.AppsV1Api, client: TestClient) -> None:
    read: Any = apps.read_namespaced_deployment_scale("demo", "default")
    assert (read.metadata.name, read.metadata.namespace, read.spec.replicas) == ("demo", "default", 0)
    read.spec.replicas = 3
    replaced: Any = apps.replace_namespaced_deployment_scale("demo", "default", read)  # no Content-Type sent
    assert type(replaced).__name__ == "V1Scale" and replaced.spec.replicas == 3
    job = replaced.metadata.annotations["epctl.io/reconfiguration"]
    assert client.get(f"/v1/reconfigurations/{job}").json()["to_dp_size"] == 3


def test_patch_forms_scale(apps: k8s.AppsV1Api) -> None:
    patched: Any = apps.patch_namespaced_deployment_scale("demo", "default", {"spec": {"replicas": 2}})
    assert patched.spec.replicas == 2
    version = patched.metadata.resource_version
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "replace", "path": "/spec/replicas", "value": 4},
    ]
    again: Any = apps.patch_namespaced_deployment_scale("demo", "default", ops)
    assert again.spec.replicas == 4


@pytest.mark.databases("sqlite", "postgres")
def test_a_stale_replace_is_a_409_status(apps: k8s.AppsV1Api) -> None:
    stale: Any = apps.read_namespaced_deployment_scale("demo", "default")
    apps.patch_namespaced_deployment_scale("demo", "default", {"spec": {"replicas": 2}})
    stale.spec.replicas = 3
    with pytest.raises(ApiException) as refused:
        apps.replace_namespaced_deployment_scale("demo", "default", stale)
    status = _body(refused.value)
    assert refused.value.status == 409
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Conflict", 409)
    assert "has been modified" in status["message"]


def test_another_namespace_is_not_found(apps: k8s.AppsV1Api) -> None:
    with pytest.raises(ApiException) as missing:
        apps.read_namespaced_deployment_scale("demo", "elsewhere")
    assert missing.value.status == 404 and _body(missing.value)["reason"] == "NotFound"


def test_put_without_content_type_is_json_and_a_wrong_type_is_415(client: TestClient) -> None:
    assert client.post("/v1/deployments", json={"name": "demo", "max_dp_size": 4}).status_code == 201
    body = {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": "demo"},
        "spec": {"replicas": 2},
    }
    raw = json.dumps(body).encode()
    taken = client.put("/v1/deployments/demo/scale", content=raw)
    assert "content-type" not in taken.request.headers
    assert taken.status_code == 200 and taken.json()["spec"]["replicas"] == 2, taken.text
    # Read as JSON, a body that is no Scale is the client's mistake in its content, not in its type.
    not_a_scale = client.put("/v1/deployments/demo/scale", content=b"[1]")
    assert not_a_scale.status_code == 422, not_a_scale.text
    refused = client.put("/v1/deployments/demo/scale", content=raw, headers={"content-type": "text/plain"})
    assert refused.status_code == 415 and refused.json()["code"] == "unsupported-media-type"
    # PATCH keeps naming its type: the API server refuses a patch without one too.
    untyped = client.patch("/v1/deployments/demo/scale", content=b'{"spec": {"replicas": 3}}')
    assert untyped.status_code == 415
