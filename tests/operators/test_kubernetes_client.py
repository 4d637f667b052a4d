"""`/v1/deployments/{name}/scale` through the `kubernetes` Python client itself, against a real
coordinator: its own models (`V1Scale`, `V1ObjectMeta`, `V1ScaleSpec`) serialized by its own
`ApiClient`, sent by its own REST layer with the Content-Type it picks (a strategic merge patch for an
object body, a JSON patch for a list: what `patch_namespaced_deployment_scale` sends), and its answers
decoded back into a `V1Scale`. Only the path is ours (a Scale of a Kubernetes Deployment lives at
`/apis/apps/v1/...`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.support.processes import Coordinator

SCALE_PATH = "/v1/deployments/{name}/scale"


@pytest.fixture
def coordinator(database_url: str, tmp_path: Path) -> Iterator[Coordinator]:
    env = {"EPCTL_RUNNER_ENABLED": "false", "EPCTL_WEBHOOK_WORKER_ENABLED": "false"}
    with Coordinator(database_url, tmp_path / "coordinator", env=env) as live:
        # The local launcher (its runner off): a job it is asked for stays pending, so later writes defer.
        live.api.post("/v1/deployments", json={"name": "demo", "max_dp_size": 4}).raise_for_status()
        yield live


@pytest.fixture
def api(coordinator: Coordinator) -> Iterator[k8s.ApiClient]:
    configuration = k8s.Configuration(host=coordinator.url)
    configuration.api_key = {"BearerToken": coordinator.admin_token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    with k8s.ApiClient(configuration) as client:
        yield client


def call(api: k8s.ApiClient, method: str, body: Any = None) -> Any:
    """One call as the client's generated `*_namespaced_deployment_scale` methods make it; the answer
    decoded into the client's `V1Scale`."""
    headers = {"Accept": "application/json"}
    if body is not None:
        # The generated PATCH methods offer these and pick the first JSON one; the REST layer then
        # sends a strategic merge patch for an object body (kubernetes/client/rest.py).
        headers["Content-Type"] = api.select_header_content_type(
            [
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ]
            if method == "PATCH"
            else ["application/json"]
        )
    request = api.param_serialize(
        method=method,
        resource_path=SCALE_PATH,
        path_params={"name": "demo"},
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request)
    response.read()
    return api.response_deserialize(response, {"200": "V1Scale"}).data


def test_reads_and_patches_built_with_the_clients_models_are_accepted(api: k8s.ApiClient) -> None:
    read = call(api, "GET")
    assert type(read).__name__ == "V1Scale"  # the client's own model, decoded by it
    assert (read.metadata.name, read.spec.replicas, read.status.selector) == (
        "demo",
        0,
        "epctl.io/deployment=demo",
    )
    # An object body: `kubectl scale`'s {"spec": {"replicas": N}}, as the client's model.
    scaled = call(api, "PATCH", k8s.V1Scale(spec=k8s.V1ScaleSpec(replicas=2)))
    assert scaled.spec.replicas == 2 and scaled.metadata.annotations["epctl.io/reconfiguration"]
    # A list body: a JSON patch, with the version it read as its precondition.
    version = scaled.metadata.resource_version
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "replace", "path": "/spec/replicas", "value": 3},
    ]
    again = call(api, "PATCH", ops)
    assert again.spec.replicas == 3 and again.metadata.resource_version != version
    # A whole V1Scale echoed back with the version it read (the PUT client-go's scale client sends).
    current = call(api, "GET")
    current.spec.replicas = 4
    assert call(api, "PUT", current).spec.replicas == 4


def test_a_stale_version_is_refused_with_a_409_the_client_raises(api: k8s.ApiClient) -> None:
    stale = call(api, "GET").metadata.resource_version
    call(api, "PATCH", k8s.V1Scale(spec=k8s.V1ScaleSpec(replicas=2)))
    body = k8s.V1Scale(metadata=k8s.V1ObjectMeta(resource_version=stale), spec=k8s.V1ScaleSpec(replicas=3))
    with pytest.raises(ApiException) as refused:
        call(api, "PATCH", body)
    assert refused.value.status == 409 and "scale-resource-version-conflict" in str(refused.value.body)
