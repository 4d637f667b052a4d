"""The Kubernetes objects the coordinator serves under `/api`, `/apis` and `/version`, HTTP-free.

One API group of ours, `epctl.io/v1`, with one namespaced resource, `deployments` (kind `Deployment`:
the coordinator's deployments, read-only), and its `scale` subresource (kind `autoscaling/v1` `Scale`,
read and written as `/v1/deployments/{name}/scale`). That is what kubectl's discovery and client-go's
scale client (`kubectl scale`, an HPA behind an aggregated API) need to find the subresource; the
documents follow `k8s.io/apimachinery/pkg/apis/meta/v1` (APIVersions, APIGroupList, APIResourceList,
Status, Table).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.deployments.models import Deployment
from app.scale.models import SELECTOR_LABEL, Scale

GROUP = "epctl.io"
VERSION = "v1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
RESOURCE = "deployments"
KIND = "Deployment"
# Clients that address a Deployment's scale in `apps/v1` (the `kubernetes` client's `AppsV1Api`,
# client-go's typed `AppsV1().Deployments(ns).UpdateScale`) are served the same subresource there;
# `apps` is not in discovery, so kubectl never mistakes our deployments for the built-in kind.
APPS_GROUP_VERSION = "apps/v1"

# Kubernetes' `StatusReason` for each status code the coordinator answers (metav1.StatusReason*).
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Gone",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def api_versions() -> dict[str, Any]:
    """`GET /api`: the legacy core group; we serve none of it (kubectl reads an empty list as such)."""
    return {"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []}


def api_group() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    }


def api_group_list() -> dict[str, Any]:
    """`GET /apis`: our one group."""
    group = api_group()
    del group["kind"], group["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}


def api_resource_list() -> dict[str, Any]:
    """`GET /apis/epctl.io/v1`: `deployments` (get, list) and `deployments/scale` (get, update, patch),
    the latter naming its kind's group and version as the API server does for a Deployment's scale."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": RESOURCE,
                "singularName": "deployment",
                "namespaced": True,
                "kind": KIND,
                "verbs": ["get", "list"],
                "shortNames": ["epdeploy"],
                "categories": ["epctl"],
            },
            {
                "name": f"{RESOURCE}/scale",
                "singularName": "",
                "namespaced": True,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            },
        ],
    }


def server_version(api_version: str) -> dict[str, Any]:
    """`GET /version`: the coordinator's own version (not a Kubernetes release), in version.Info's shape."""
    major, _, rest = api_version.partition(".")
    minor = rest.partition(".")[0]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{api_version}+epctl",
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "",
        "compiler": "",
        "platform": "epctl coordinator",
    }


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def deployment_object(deployment: Deployment, scale: Scale, namespace: str) -> dict[str, Any]:
    """A deployment as an `epctl.io/v1` `Deployment`: `spec.replicas`/`status.replicas` as on its Scale."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "metadata": {
            "name": deployment.name,
            "namespace": namespace,
            "uid": deployment.id,
            "resourceVersion": scale.metadata.resourceVersion,
            "creationTimestamp": _timestamp(deployment.created_at),
            "labels": {SELECTOR_LABEL: deployment.name},
        },
        "spec": {
            "replicas": scale.spec.replicas,
            "minReplicas": deployment.min_dp_size,
            "maxReplicas": deployment.max_dp_size,
        },
        "status": {
            "replicas": deployment.current_dp_size,
            "generation": deployment.generation,
            "phase": deployment.status,
            "selector": f"{SELECTOR_LABEL}={deployment.name}",
        },
    }


def deployment_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": f"{KIND}List", "metadata": {}, "items": items}


def _age(created: datetime, now: datetime) -> str:
    """kubectl's short age (`45s`, `12m`, `5h`, `3d`)."""
    seconds = max(0, int((now - created.astimezone(UTC)).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


TABLE_COLUMNS = [
    ("Name", "string", "name", "the deployment's name"),
    ("Desired", "integer", "", "spec.replicas: the DP size asked for last"),
    ("Current", "integer", "", "status.replicas: the DP size now"),
    ("Generation", "integer", "", "the deployment's generation"),
    ("Status", "string", "", "the deployment's status"),
    ("Age", "string", "", "time since the deployment was created"),
]


def deployment_table(objects: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    """A `meta.k8s.io/v1` `Table` of deployments: what `kubectl get` asks for and prints as is."""
    rows = []
    for item in objects:
        created = datetime.strptime(item["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
        cells = [
            item["metadata"]["name"],
            item["spec"]["replicas"],
            item["status"]["replicas"],
            item["status"]["generation"],
            item["status"]["phase"],
            _age(created.replace(tzinfo=UTC), now),
        ]
        partial = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": item["metadata"],
        }
        rows.append({"cells": cells, "object": partial})
    columns = [
        {"name": name, "type": kind, "format": form, "description": text, "priority": 0}
        for name, kind, form, text in TABLE_COLUMNS
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": columns,
        "rows": rows,
    }


def wants_table(accept: str) -> bool:
    """Whether the Accept header asks for a Table (`application/json;as=Table;v=v1;g=meta.k8s.io`)."""
    return any(
        "as=table" in part.replace(" ", "").lower() and "g=meta.k8s.io" in part.replace(" ", "").lower()
        for part in accept.split(",")
    )


def status_object(status: int, message: str, *, code: str | None, name: str | None = None) -> dict[str, Any]:
    """A failed request as a `v1` `Status` (what kubectl prints as `Error from server (<reason>): ...`);
    the coordinator's own error code is the first cause's `reason`."""
    details: dict[str, Any] = {"group": GROUP, "kind": RESOURCE}
    if name:
        details["name"] = name
    if code:
        details["causes"] = [{"reason": code, "message": message}]
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": REASONS.get(status, "Unknown"),
        "details": details,
        "code": status,
    }
