"""`GET/PUT /v1/deployments/{name}/scale`: the deployment's width in Kubernetes' `autoscaling/v1` Scale
shape, for HPA/KEDA-style clients and adapters. A PUT answers 200 with the Scale (Kubernetes' answer to
an update, which client-go's scale client decodes), plus `Location` of the reconfiguration job it
created (also in the annotation `epctl.io/reconfiguration`); the job runs on, as pods do after a
Deployment's scale is set."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import DatabaseDep, Reader, Scaler, SettingsDep
from app.api.params import DeploymentRefPath
from app.core.problems import problem_responses
from app.jobs.requests import IdempotencyKeyHeader, idempotency_of, point_at_job
from app.scale import service
from app.scale.models import Scale

router = APIRouter(
    prefix="/v1/deployments", tags=["deployments"], responses=problem_responses(401, 403, 404, 422)
)


@router.get("/{name}/scale", name="get-scale", response_model_exclude_none=True)
async def get_scale(name: DeploymentRefPath, db: DatabaseDep, _: Reader) -> Scale:
    """The deployment's Scale: `spec.replicas` the desired DP size, `status.replicas` the current one."""
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
    under the rules of `POST /v1/reconfigurations`. The size already desired changes nothing."""
    outcome = await db.run(
        lambda session: service.put_scale(
            session,
            ref=name,
            scale=body,
            requester=principal.name,
            idempotency=idempotency_of(idempotency_key, principal, settings),
        )
    )
    point_at_job(response, outcome.job.id if outcome.job else None, replayed=outcome.replayed)
    return outcome.scale
