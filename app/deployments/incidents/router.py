from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlmodel import Session

from app.api.deps import DatabaseDep, Reader
from app.api.params import REF_PATTERN, DeploymentFilterQuery
from app.core.problems import problem_responses
from app.deployments.incidents import service
from app.deployments.incidents.models import IncidentList, IncidentPublic, IncidentState
from app.deployments.service import get_deployment

router = APIRouter(prefix="/v1/incidents", tags=["incidents"], responses=problem_responses(401, 403, 422))

IncidentIdPath = Annotated[str, Path(pattern=REF_PATTERN, description="an incident id (`inc_...`)")]


@router.get("", name="list", responses=problem_responses(404))
async def list_incidents(
    db: DatabaseDep,
    _: Reader,
    deployment: DeploymentFilterQuery = None,
    state: IncidentState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> IncidentList:
    """Every time a deployment stopped being whole, newest first: what was lost, when, how long until it
    served again and what clients saw; filtered by deployment and state."""

    def work(session: Session) -> IncidentList:
        deployment_id = get_deployment(session, ref=deployment).id if deployment else None
        rows = service.list_incidents(session, deployment_id=deployment_id, state=state, limit=limit)
        return IncidentList(data=[service.public(session, row) for row in rows], count=len(rows))

    return await db.run(work)


@router.get("/{incident_id}", name="get", responses=problem_responses(404))
async def get_incident(incident_id: IncidentIdPath, db: DatabaseDep, _: Reader) -> IncidentPublic:
    return await db.run(
        lambda session: service.public(session, service.get_incident(session, incident_id=incident_id))
    )
