from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response, status
from sqlmodel import Session

from app.api.deps import DatabaseDep, EngineAgent, Reader
from app.api.params import DeploymentFilterQuery, EngineIdPath
from app.coordinators import service as coordinators
from app.core import wake
from app.core.clock import utc_now
from app.core.problems import problem_responses
from app.core.stuck import STUCK
from app.deployments.engines import service
from app.deployments.engines.fast_path import WHOLE_PATH, steady_answer
from app.deployments.engines.models import (
    Engine,
    EngineHeartbeat,
    EngineHeartbeatAnswer,
    EngineList,
    EnginePublic,
    EngineRegistration,
    EngineState,
)
from app.deployments.models import Deployment
from app.deployments.reactions import Reactions
from app.deployments.spares import role_of, spare_ids

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/engines", tags=["engines"], responses=problem_responses(401, 403, 422))


def _public(session: Session, engine: Engine) -> EnginePublic:
    """The engine's shape, its deployment's name read through the session (a deployment it loaded
    already costs no query)."""
    deployment = session.get(Deployment, engine.deployment_id)
    return EnginePublic.of(engine, deployment=deployment.name if deployment is not None else "")


@router.post(
    "",
    name="register",
    status_code=status.HTTP_201_CREATED,
    responses={
        **problem_responses(404, 409),
        200: {"model": EnginePublic, "description": "registered again"},
    },
)
async def register_engine(
    body: EngineRegistration, db: DatabaseDep, _: EngineAgent, response: Response
) -> EnginePublic:
    """An agent announces itself. Registering the same engine_id again updates it (200).
    Engine ids are 1-128 characters: letters, digits, `.`, `_`, `:` and `-`, starting with a letter or
    digit."""

    def work(session: Session) -> tuple[EnginePublic, bool]:
        engine, created = service.register_engine(session, registration=body)
        return _public(session, engine), created

    public, created = await db.run(work)
    if not created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/engines/{public.id}"
    return public


@router.get("", name="list", responses=problem_responses(404))
async def list_engines(
    db: DatabaseDep, _: Reader, deployment: DeploymentFilterQuery = None, state: EngineState | None = None
) -> EngineList:
    def work(session: Session) -> EngineList:
        rows = service.list_engines(session, deployment=deployment, state=state)
        names = service.deployment_names(session, {row.deployment_id for row in rows})
        owners = [d for d in (session.get(Deployment, i) for i in names) if d is not None]
        spares = {e for ids in spare_ids(session, owners).values() for e in ids}
        return EngineList(
            data=[
                EnginePublic.of(r, deployment=names.get(r.deployment_id, ""), role=role_of(r, spares))
                for r in rows
            ],
            count=len(rows),
        )

    return await db.run(work)


@router.get("/{engine_id}", name="get", responses=problem_responses(404))
async def get_engine(engine_id: EngineIdPath, db: DatabaseDep, _: Reader) -> EnginePublic:
    return await db.run(lambda session: _public(session, service.get_engine(session, engine_id=engine_id)))


@router.post("/{engine_id}/heartbeat", name="heartbeat", responses=problem_responses(404, 409, 503))
async def heartbeat(
    engine_id: EngineIdPath,
    body: EngineHeartbeat,
    db: DatabaseDep,
    _: EngineAgent,
    backends: Reactions,
    request: Request,
) -> EngineHeartbeatAnswer:
    """The engine's own truth (state, generation, rank, a broken group). The answer lists every live
    coordinator sharing the database: the agent fails over to another when this one dies. A saturated
    coordinator answers 503 `heartbeat-shed` at once, with Retry-After: heard, not recorded
    (`app.core.shedding`); the agent sends the next one after Retry-After."""

    def group_broke(session: Session, engine: Engine) -> None:
        backends.group_broke(session, engine.deployment_id)

    # Stuck in a serving collective (issue 39): this coordinator's memory, judged at once when news.
    stuck_news = STUCK.note(engine_id, body.stuck_generation, body.stuck_ms, body.stuck_unanswered, utc_now())
    if stuck_news:
        log.warning(
            "engine %s stuck %.0f ms in a serving collective of generation %s; its probe found silent: %s",
            engine_id,
            body.stuck_ms,
            body.stuck_generation,
            body.stuck_unanswered or "none",
        )
    # A heartbeat that only renews the record is written with the others waiting (one commit for all:
    # issue 37, 700 heartbeats a second) and answered once committed; any other takes the whole path.
    # Most come answered by the fast path already (`fast_path.HeartbeatFastPath`, the same function);
    # one it found needing the whole path comes marked, not to be tried again. A stuck report comes
    # here always (the fast path leaves it to this route, for the note above and the wake).
    if not request.scope.get(WHOLE_PATH):
        steady = await steady_answer(request.app.state, db, engine_id, body, request.scope)
        if steady is not None:
            if stuck_news:
                wake.ring(wake.LIVENESS)
            return steady

    def work(session: Session) -> tuple[EngineHeartbeatAnswer, bool]:
        engine = service.record_heartbeat(session, engine_id=engine_id, heartbeat=body, on_break=group_broke)
        public = _public(session, engine)
        answer = EngineHeartbeatAnswer.of(public, coordinators=coordinators.live_urls_recent(session))
        return answer, service.reported_break_now(engine)

    answer, broke = await db.run(work)
    if broke or stuck_news:
        # The status is written already (`group_broke`); the liveness pass fences and heals now, not at
        # its next interval (issue 34).
        wake.ring(wake.LIVENESS)
    return answer


@router.delete(
    "/{engine_id}",
    name="deregister",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(404),
)
async def deregister_engine(engine_id: EngineIdPath, db: DatabaseDep, _: EngineAgent) -> None:
    """The engine is kept, marked `left`, and never picked for a job again."""
    await db.run(lambda session: service.deregister_engine(session, engine_id=engine_id))
