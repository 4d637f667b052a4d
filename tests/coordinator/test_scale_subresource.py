"""`GET/PUT /v1/deployments/{name}/scale`: Kubernetes' autoscaling/v1 `Scale`, creating jobs under the
rules of `POST /v1/reconfigurations` (source `scale-subresource`)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from tests.support.fixtures import token_headers

# The Kubernetes API reference's fields (io.k8s.api.autoscaling.v1.Scale, ScaleSpec, ScaleStatus and
# io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta, https://kubernetes.io/docs/reference/kubernetes-api/),
# written down here with their types. `additionalProperties: false`: we emit no field Kubernetes lacks.
INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
OBJECT_META = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "annotations": STRING_MAP,
        "creationTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "generateName": {"type": "string"},
        "generation": {"type": "integer"},
        "labels": STRING_MAP,
        "managedFields": {"type": "array", "items": {"type": "object"}},
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
        "resourceVersion": {"type": "string"},
        "selfLink": {"type": "string"},
        "uid": {"type": "string"},
    },
}
SCALE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": OBJECT_META,
        "spec": {"type": "object", "additionalProperties": False, "properties": {"replicas": INT32}},
        "status": {
            "type": "object",
            "additionalProperties": False,
            "required": ["replicas"],
            "properties": {"replicas": INT32, "selector": {"type": "string"}},
        },
    },
}

DEMO = {"name": "demo", "min_dp_size": 1, "max_dp_size": 4}


def scale_body(replicas: int | None, **metadata: Any) -> dict[str, Any]:
    spec = {} if replicas is None else {"replicas": replicas}
    return {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": "demo", **metadata},
        "spec": spec,
    }


@pytest.fixture
def demo(client: TestClient) -> TestClient:
    assert client.post("/v1/deployments", json=DEMO).status_code == 201
    return client


def _assert_problem(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = dict(response.json())
    if code is not None:
        assert body["code"] == code, body
    return body


def _job_count(client: TestClient) -> int:
    return int(client.get("/v1/reconfigurations").json()["count"])


def test_get_answers_a_kubernetes_scale(demo: TestClient) -> None:
    response = demo.get("/v1/deployments/demo/scale")
    assert response.status_code == 200
    scale = response.json()
    jsonschema.validate(scale, SCALE_SCHEMA, format_checker=jsonschema.FormatChecker())
    assert (scale["apiVersion"], scale["kind"], scale["metadata"]["name"]) == (
        "autoscaling/v1",
        "Scale",
        "demo",
    )
    assert scale["spec"] == {"replicas": 0} and scale["status"] == {
        "replicas": 0,
        "selector": "epctl.io/deployment=demo",
    }
    assert scale["metadata"]["uid"].startswith("dep") and scale["metadata"]["resourceVersion"]


def test_put_creates_a_job_with_its_location(demo: TestClient) -> None:
    response = demo.put("/v1/deployments/demo/scale", json=scale_body(2))
    assert response.status_code == 200, response.text
    scale = response.json()
    jsonschema.validate(scale, SCALE_SCHEMA)
    job_id = response.headers["location"].rsplit("/", 1)[-1]
    assert response.headers["location"] == f"/v1/reconfigurations/{job_id}"
    assert scale["metadata"]["annotations"]["epctl.io/reconfiguration"] == job_id
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 0
    job = demo.get(f"/v1/reconfigurations/{job_id}").json()
    assert (job["to_dp_size"], job["state"], job["requested_by"]) == (2, "pending", "scale-subresource")
    # The job is the desired size now: GET shows it in spec while status stays at the current size.
    again = demo.get("/v1/deployments/demo/scale").json()
    assert (again["spec"]["replicas"], again["status"]["replicas"]) == (2, 0)
    assert again["metadata"]["annotations"]["epctl.io/active-reconfiguration"] == job_id


def test_a_second_put_while_a_job_is_active_is_recorded_as_desired_naming_it(demo: TestClient) -> None:
    first = demo.put("/v1/deployments/demo/scale", json=scale_body(2))
    job_id = first.headers["location"].rsplit("/", 1)[-1]
    second = demo.put("/v1/deployments/demo/scale", json=scale_body(3))
    assert second.status_code == 200 and "location" not in second.headers
    assert job_id in second.json()["metadata"]["annotations"]["epctl.io/deferred"]
    assert second.json()["spec"]["replicas"] == 3
    assert demo.get("/v1/deployments/demo").json()["desired"]["pending"] is True
    assert _job_count(demo) == 1


def test_put_of_the_size_already_desired_changes_nothing(demo: TestClient) -> None:
    demo.put("/v1/deployments/demo/scale", json=scale_body(2))
    response = demo.put("/v1/deployments/demo/scale", json=scale_body(2))
    assert response.status_code == 200 and "location" not in response.headers
    assert response.json()["spec"]["replicas"] == 2 and _job_count(demo) == 1


@pytest.mark.parametrize("replicas", [5, 2**31 - 1])
def test_out_of_range_replicas_are_422_problems_and_create_nothing(demo: TestClient, replicas: int) -> None:
    body = _assert_problem(
        demo.put("/v1/deployments/demo/scale", json=scale_body(replicas)), 422, "target-out-of-range"
    )
    assert (body["min_dp_size"], body["max_dp_size"]) == (1, 4)
    assert body["detail"] == f"spec.replicas {replicas} is outside the limits of deployment 'demo': [1, 4]"
    assert _job_count(demo) == 0


def test_scale_to_zero_is_out_of_range(demo: TestClient) -> None:
    # A new deployment is at 0: a PUT of 0 asks for nothing. Once 2 is desired, 0 is below min_dp_size.
    assert demo.put("/v1/deployments/demo/scale", json=scale_body(0)).status_code == 200
    assert _job_count(demo) == 0
    demo.put("/v1/deployments/demo/scale", json=scale_body(2))
    _assert_problem(demo.put("/v1/deployments/demo/scale", json=scale_body(0)), 422, "target-out-of-range")
    assert _job_count(demo) == 1


@pytest.mark.parametrize(
    "body",
    [
        scale_body(-1),
        scale_body(2**31),
        scale_body(None),
        {**scale_body(2), "kind": "Deployment"},
        {**scale_body(2), "apiVersion": "apps/v1"},
        {**scale_body(2), "spec": {"replicas": 2, "paused": True}},
        {**scale_body(2), "metadata": {"name": "demo", "colour": "red"}},
        {**scale_body(2), "spec": {"replicas": "two"}},
    ],
    ids=[
        "negative",
        "over-int32",
        "no-replicas",
        "kind",
        "api-version",
        "spec-field",
        "meta-field",
        "string",
    ],
)
def test_bad_scale_bodies_are_422_problems(demo: TestClient, body: dict[str, Any]) -> None:
    _assert_problem(demo.put("/v1/deployments/demo/scale", json=body), 422)
    assert _job_count(demo) == 0


def test_a_name_other_than_the_urls_is_422(demo: TestClient) -> None:
    body = scale_body(2)
    body["metadata"]["name"] = "other"
    _assert_problem(demo.put("/v1/deployments/demo/scale", json=body), 422, "scale-name-mismatch")


def test_a_client_may_echo_back_what_it_read(demo: TestClient) -> None:
    read = demo.get("/v1/deployments/demo/scale").json()
    read["spec"]["replicas"] = 2
    response = demo.put("/v1/deployments/demo/scale", json=read)  # status and metadata included
    assert response.status_code == 200, response.text
    assert response.json()["spec"]["replicas"] == 2


def test_a_stale_resource_version_is_409(demo: TestClient) -> None:
    stale = demo.get("/v1/deployments/demo/scale").json()["metadata"]["resourceVersion"]
    demo.put("/v1/deployments/demo/scale", json=scale_body(2))
    body = _assert_problem(
        demo.put("/v1/deployments/demo/scale", json=scale_body(3, resourceVersion=stale)),
        409,
        "scale-resource-version-conflict",
    )
    assert body["resource_version"] != stale


def test_idempotency_key_replays_the_first_job(demo: TestClient) -> None:
    headers = {"Idempotency-Key": "hpa-1"}
    first = demo.put("/v1/deployments/demo/scale", json=scale_body(2), headers=headers)
    again = demo.put("/v1/deployments/demo/scale", json=scale_body(2), headers=headers)
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == first.headers["location"] and _job_count(demo) == 1
    other = demo.put("/v1/deployments/demo/scale", json=scale_body(3), headers=headers)
    _assert_problem(other, 422, "idempotency-key-reused")


def test_unknown_deployment_is_404(client: TestClient) -> None:
    _assert_problem(client.get("/v1/deployments/nope/scale"), 404)
    _assert_problem(client.put("/v1/deployments/nope/scale", json=scale_body(2)), 404)


def test_roles_autoscaler_may_scale_viewer_may_only_read(demo: TestClient) -> None:
    viewer = token_headers(demo, "viewer")
    autoscaler = token_headers(demo, "autoscaler")
    assert demo.get("/v1/deployments/demo/scale", headers=viewer).status_code == 200
    _assert_problem(demo.put("/v1/deployments/demo/scale", json=scale_body(2), headers=viewer), 403)
    assert _job_count(demo) == 0
    anonymous = {"Authorization": ""}
    _assert_problem(demo.get("/v1/deployments/demo/scale", headers=anonymous), 401)
    response = demo.put("/v1/deployments/demo/scale", json=scale_body(2), headers=autoscaler)
    assert response.status_code == 200, response.text
    job = demo.get(response.headers["location"]).json()
    assert job["requested_by"] == "scale-subresource" and job["requester"] == "autoscaler-token"


# --- optimistic concurrency (issue 26, item 4) ---------------------------------------------------------


def _version(client: TestClient) -> str:
    return str(client.get("/v1/deployments/demo/scale").json()["metadata"]["resourceVersion"])


def test_a_deferred_write_bumps_the_resource_version_so_a_stale_one_is_409(demo: TestClient) -> None:
    demo.put("/v1/deployments/demo/scale", json=scale_body(2))  # a job is active: writes now defer
    read = _version(demo)
    deferred = demo.put("/v1/deployments/demo/scale", json=scale_body(3, resourceVersion=read))
    assert deferred.status_code == 200 and "epctl.io/deferred" in deferred.json()["metadata"]["annotations"]
    assert deferred.json()["metadata"]["resourceVersion"] != read
    stale = demo.put("/v1/deployments/demo/scale", json=scale_body(4, resourceVersion=read))
    _assert_problem(stale, 409, "scale-resource-version-conflict")
    assert demo.get("/v1/deployments/demo/scale").json()["spec"]["replicas"] == 3


@pytest.mark.databases("sqlite", "postgres")
@pytest.mark.parametrize("deferred", [False, True], ids=["job", "deferred"])
def test_of_two_writers_with_the_same_resource_version_exactly_one_wins(
    demo: TestClient, deferred: bool
) -> None:
    if deferred:
        demo.put("/v1/deployments/demo/scale", json=scale_body(2))  # an active job: both writes defer
    read = _version(demo)

    def write(replicas: int) -> int:
        return demo.put(
            "/v1/deployments/demo/scale", json=scale_body(replicas, resourceVersion=read)
        ).status_code

    with ThreadPoolExecutor(2) as pool:
        statuses = sorted(pool.map(write, [3, 4]))
    assert statuses == [200, 409], statuses
    assert _job_count(demo) == 1


def _patch(client: TestClient, body: Any, content_type: str, **headers: str) -> Any:
    return client.patch(
        "/v1/deployments/demo/scale",
        content=json.dumps(body).encode(),
        headers={"content-type": content_type, **headers},
    )


@pytest.mark.parametrize(
    "content_type",
    ["application/merge-patch+json", "application/strategic-merge-patch+json; charset=utf-8"],
)
def test_a_merge_patch_of_spec_replicas_scales(demo: TestClient, content_type: str) -> None:
    response = _patch(demo, {"spec": {"replicas": 2}}, content_type)  # what `kubectl scale` sends
    assert response.status_code == 200, response.text
    assert response.json()["spec"]["replicas"] == 2 and response.headers["location"]


def test_a_json_patch_replaces_spec_replicas_and_tests_the_version(demo: TestClient) -> None:
    read = _version(demo)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": read},
        {"op": "replace", "path": "/spec/replicas", "value": 2},
    ]
    assert _patch(demo, ops, "application/json-patch+json").status_code == 200
    stale = _patch(demo, [{**ops[0]}, {**ops[1], "value": 3}], "application/json-patch+json")
    _assert_problem(stale, 409, "scale-resource-version-conflict")


def test_a_merge_patch_with_a_stale_version_is_409(demo: TestClient) -> None:
    read = _version(demo)
    demo.put("/v1/deployments/demo/scale", json=scale_body(2))
    stale = _patch(
        demo, {"metadata": {"resourceVersion": read}, "spec": {"replicas": 3}}, "application/merge-patch+json"
    )
    _assert_problem(stale, 409, "scale-resource-version-conflict")


@pytest.mark.parametrize(
    ("ops", "code"),
    [
        ([{"op": "remove", "path": "/spec/replicas"}], "unsupported-patch"),
        ([{"op": "replace", "path": "/metadata/name", "value": "x"}], "unsupported-patch"),
        ([{"op": "move", "from": "/spec/replicas", "path": "/status/replicas"}], "unsupported-patch"),
        ([{"op": "test", "path": "/spec/replicas", "value": 7}], "patch-test-failed"),
        ({"op": "replace"}, "malformed-patch"),
    ],
    ids=["remove", "other-path", "move", "failed-test", "not-a-list"],
)
def test_json_patch_operations_that_make_no_sense_for_a_scale_are_422(
    demo: TestClient, ops: Any, code: str
) -> None:
    _assert_problem(_patch(demo, ops, "application/json-patch+json"), 422, code)
    assert _job_count(demo) == 0


@pytest.mark.parametrize("content_type", ["application/json", "application/apply-patch+yaml", "text/plain"])
def test_patch_with_another_content_type_is_415(demo: TestClient, content_type: str) -> None:
    body = _assert_problem(
        _patch(demo, {"spec": {"replicas": 2}}, content_type), 415, "unsupported-media-type"
    )
    assert "application/merge-patch+json" in body["accepted"]
    assert _job_count(demo) == 0


def test_a_merge_patch_making_an_invalid_scale_is_422(demo: TestClient) -> None:
    _assert_problem(
        _patch(demo, {"spec": {"replicas": "two"}}, "application/merge-patch+json"), 422, "invalid-scale"
    )


@pytest.mark.parametrize("section", ["metadata", "spec", "kind"])
def test_a_merge_patch_removing_a_section_of_the_scale_is_422(demo: TestClient, section: str) -> None:
    patch = {"spec": {"replicas": 0}, section: None}
    _assert_problem(_patch(demo, patch, "application/strategic-merge-patch+json"), 422, "malformed-patch")
    assert _job_count(demo) == 0


def test_a_scale_write_supersedes_older_autoscaler_intents(demo: TestClient) -> None:
    headers = token_headers(demo, "autoscaler", "keda")
    demo.put("/v1/deployments/demo/scale", json=scale_body(2))  # an active job: the hook defers
    asked = demo.post(
        "/v1/hooks/scale", json={"deployment": "demo", "target_dp_size": 4}, headers=headers
    ).json()
    assert asked["decision"] == "deferred"
    demo.put("/v1/deployments/demo/scale", json=scale_body(3))
    superseded = demo.get("/v1/hooks/requests", params={"decision": "superseded"}).json()["data"]
    assert [(r["intent_id"], r["code"]) for r in superseded] == [(asked["intent_id"], "scale-subresource")]
