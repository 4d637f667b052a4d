from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.api.deps import EngineAgent, Reader, SessionDep
from app.core.problems import problem_responses
from app.engines import service
from app.engines.models import Engine, EngineList, EnginePublic, EngineState
from engine_agent.protocol import AgentHeartbeat, AgentRegistration

router = APIRouter(prefix="/v1/engines", tags=["engines"], responses=problem_responses(401, 403, 422))


def _public(session: SessionDep, engine: Engine) -> EnginePublic:
    names = service.deployment_names(session, {engine.deployment_id})
    return EnginePublic.from_row(engine, deployment_name=names.get(engine.deployment_id, ""))


@router.post("", name="register", status_code=status.HTTP_201_CREATED, responses=problem_responses(404, 409))
def register_engine(
    body: AgentRegistration, session: SessionDep, _: EngineAgent, response: Response
) -> EnginePublic:
    """An agent announces itself. Registering the same engine_id again updates it (200)."""
    engine, created = service.register_engine(session, registration=body)
    if not created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/engines/{engine.id}"
    return _public(session, engine)


@router.get("", name="list")
def list_engines(
    session: SessionDep, _: Reader, deployment: str | None = None, state: EngineState | None = None
) -> EngineList:
    rows = service.list_engines(session, deployment=deployment, state=state)
    names = service.deployment_names(session, {row.deployment_id for row in rows})
    return EngineList(
        data=[EnginePublic.from_row(r, deployment_name=names.get(r.deployment_id, "")) for r in rows],
        count=len(rows),
    )


@router.get("/{engine_id}", name="get", responses=problem_responses(404))
def get_engine(engine_id: str, session: SessionDep, _: Reader) -> EnginePublic:
    return _public(session, service.get_engine(session, engine_id=engine_id))


@router.post("/{engine_id}/heartbeat", name="heartbeat", responses=problem_responses(404, 409))
def heartbeat(engine_id: str, body: AgentHeartbeat, session: SessionDep, _: EngineAgent) -> EnginePublic:
    return _public(session, service.record_heartbeat(session, engine_id=engine_id, heartbeat=body))


@router.delete(
    "/{engine_id}",
    name="deregister",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(404),
)
def deregister_engine(engine_id: str, session: SessionDep, _: EngineAgent) -> None:
    """The engine is kept, marked `left`, and never picked for a job again."""
    service.deregister_engine(session, engine_id=engine_id)
