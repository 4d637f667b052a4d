"""`GET/PUT/PATCH /v1/deployments/{name}/scale`: the deployment's width in Kubernetes' `autoscaling/v1`
Scale shape, for HPA/KEDA-style clients, adapters and `kubectl scale`. A write answers 200 with the
Scale (Kubernetes' answer to an update, which client-go's scale client decodes), plus `Location` of the
reconfiguration job it created (also in the annotation `epctl.io/reconfiguration`); the job runs on, as
pods do after a Deployment's scale is set. PATCH takes the merge-patch and JSON-patch forms
(`app.scale.patches`); any other Content-Type is a 415. A PUT without Content-Type is JSON, as the
Kubernetes API server reads it. The same subresource is served at Kubernetes' own paths by
`app.scale.kube`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from app.api.deps import DatabaseDep, Reader, Scaler, SettingsDep
from app.api.params import DeploymentRefPath
from app.core.problems import problem_responses
from app.jobs.requests import IdempotencyKeyHeader
from app.scale import patches, service
from app.scale.models import Scale
from app.scale.writes import write_scale

# A body without Content-Type is read as JSON, as the Kubernetes API server reads it (client-go's scale
# client and the `kubernetes` client's `replace_namespaced_deployment_scale` send none); another type
# is a 415.
router = APIRouter(
    prefix="/v1/deployments",
    tags=["deployments"],
    responses=problem_responses(401, 403, 404, 422),
    strict_content_type=False,
)

_JSON_PATCH_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["op", "path"],
        "properties": {
            "op": {"type": "string", "enum": ["test", "replace", "add"]},
            "path": {"type": "string", "examples": ["/spec/replicas"]},
            "value": {},
        },
    },
}
_PATCH_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            patches.MERGE_PATCH: {"schema": {"$ref": "#/components/schemas/Scale"}},
            patches.STRATEGIC_MERGE_PATCH: {"schema": {"$ref": "#/components/schemas/Scale"}},
            patches.JSON_PATCH: {"schema": _JSON_PATCH_SCHEMA},
        },
    }
}


@router.get("/{name}/scale", name="get-scale", response_model_exclude_none=True)
async def get_scale(name: DeploymentRefPath, db: DatabaseDep, _: Reader) -> Scale:
    """The deployment's Scale: `spec.replicas` the size asked for last, `status.replicas` the current one."""
    return await db.run(lambda session: service.get_scale(session, ref=name))


@router.put(
    "/{name}/scale", name="put-scale", response_model_exclude_none=True, responses=problem_responses(409)
)
async def put_scale(
    name: DeploymentRefPath,
    body: Scale,
    db: DatabaseDep,
    settings: SettingsDep,
    principal: Scaler,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Scale:
    """Set the target DP size (`spec.replicas`): creates a reconfiguration job (source `scale-subresource`)
    under the rules of `POST /v1/reconfigurations`, or records it while a job is active or the cooldown
    runs. The size already asked for changes nothing. A stale `metadata.resourceVersion` is a 409."""
    return await write_scale(
        db,
        ref=name,
        new_scale=lambda _session: body,
        principal=principal,
        settings=settings,
        idempotency_key=idempotency_key,
        response=response,
    )


@router.patch(
    "/{name}/scale",
    name="patch-scale",
    response_model_exclude_none=True,
    openapi_extra=_PATCH_BODY,
    responses=problem_responses(409, 415),
)
async def patch_scale(
    name: DeploymentRefPath,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    principal: Scaler,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Scale:
    """Patch the Scale (`kubectl scale` sends `{"spec": {"replicas": N}}` as a merge patch), under the
    rules of PUT: `application/merge-patch+json`, `application/strategic-merge-patch+json` (the same for
    a Scale) or `application/json-patch+json` (test, and replace/add of `/spec/replicas` and
    `/metadata/resourceVersion`)."""
    body = await request.body()
    content_type = request.headers.get("content-type", "")

    return await write_scale(
        db,
        ref=name,
        new_scale=lambda session: patches.patched_scale(
            service.get_scale(session, ref=name), content_type, body
        ),
        principal=principal,
        settings=settings,
        idempotency_key=idempotency_key,
        response=response,
    )
