"""The `autoscaling/v1` `Scale` object, as Kubernetes defines it (io.k8s.api.autoscaling.v1.Scale).

Field names are Kubernetes' own (camelCase) so that HPA/KEDA-style clients and adapters read and write
it unchanged. `ObjectMeta` lists every field of io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta: a
client that echoes back what it read is accepted; a field Kubernetes does not define is a 422.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

API_VERSION: Literal["autoscaling/v1"] = "autoscaling/v1"
KIND: Literal["Scale"] = "Scale"
INT32_MAX = 2**31 - 1
SELECTOR_LABEL = "epctl.io/deployment"
ACTIVE_JOB_ANNOTATION = "epctl.io/active-reconfiguration"
JOB_ANNOTATION = "epctl.io/reconfiguration"
DEFERRED_ANNOTATION = "epctl.io/deferred"  # the desired size is recorded; why no job has started yet


class ObjectMeta(BaseModel):
    """Kubernetes object metadata; only `name` and `resourceVersion` mean something on a PUT."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=253)
    namespace: str | None = Field(None, max_length=253)
    uid: str | None = Field(None, max_length=128)
    resourceVersion: str | None = Field(
        None, max_length=128, description="opaque; a PUT carrying a stale one is refused (409)"
    )
    generation: int | None = None
    creationTimestamp: str | None = Field(None, max_length=64)
    deletionTimestamp: str | None = Field(None, max_length=64)
    deletionGracePeriodSeconds: int | None = None
    generateName: str | None = Field(None, max_length=253)
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None
    ownerReferences: list[dict[str, Any]] | None = None
    managedFields: list[dict[str, Any]] | None = None
    selfLink: str | None = Field(None, max_length=1024)


class ScaleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replicas: int | None = Field(
        None, ge=0, le=INT32_MAX, description="the desired number of instances: the target DP size"
    )


class ScaleStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replicas: int = Field(ge=0, le=INT32_MAX, description="the observed number of instances: the DP size now")
    selector: str | None = Field(
        None, max_length=1024, description="label query (query-param syntax) over the engines counted"
    )


class Scale(BaseModel):
    """A scaling request for a deployment (GET answers it, PUT takes it: `spec.replicas` is the target)."""

    model_config = ConfigDict(extra="forbid")

    apiVersion: Literal["autoscaling/v1"] = API_VERSION
    kind: Literal["Scale"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ScaleSpec = Field(default_factory=ScaleSpec)
    status: ScaleStatus | None = Field(None, description="read-only: ignored on PUT")
