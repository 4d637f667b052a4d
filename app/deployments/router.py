from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.deps import Admin, Reader, SessionDep
from app.core.problems import problem_responses
from app.deployments import service
from app.deployments.models import (
    Deployment,
    DeploymentCreate,
    DeploymentList,
    DeploymentPublic,
    DeploymentUpdate,
)

router = APIRouter(prefix="/v1/deployments", tags=["deployments"], responses=problem_responses(401, 403, 422))


def _public(session: SessionDep, deployment: Deployment) -> DeploymentPublic:
    return DeploymentPublic.from_row(
        deployment, active_job_id=service.active_job_id(session, deployment_id=deployment.id)
    )


@router.post("", name="create", status_code=status.HTTP_201_CREATED, responses=problem_responses(409))
def create_deployment(
    body: DeploymentCreate, session: SessionDep, _: Admin, response: Response
) -> DeploymentPublic:
    deployment = service.create_deployment(session, data=body)
    response.headers["Location"] = f"/v1/deployments/{deployment.name}"
    return _public(session, deployment)


@router.get("", name="list")
def list_deployments(session: SessionDep, _: Reader) -> DeploymentList:
    rows = service.list_deployments(session)
    return DeploymentList(data=[_public(session, row) for row in rows], count=len(rows))


@router.get("/{name}", name="get", responses=problem_responses(404))
def get_deployment(name: str, session: SessionDep, _: Reader) -> DeploymentPublic:
    return _public(session, service.get_deployment(session, ref=name))


@router.patch("/{name}", name="update", responses=problem_responses(404))
def update_deployment(name: str, body: DeploymentUpdate, session: SessionDep, _: Admin) -> DeploymentPublic:
    return _public(session, service.update_deployment(session, ref=name, data=body))


@router.delete(
    "/{name}", name="delete", status_code=status.HTTP_204_NO_CONTENT, responses=problem_responses(404, 409)
)
def delete_deployment(name: str, session: SessionDep, _: Admin) -> None:
    service.delete_deployment(session, ref=name)
