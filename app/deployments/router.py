from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from sqlmodel import Session

from app.api.deps import Admin, DatabaseDep, Reader
from app.api.params import DeploymentRefPath
from app.core.problems import problem_responses
from app.deployments import agent_keys, listing, service
from app.deployments.agent_key_push import push_rotation
from app.deployments.agent_keys import AgentKeyPublic, AgentKeyRotate
from app.deployments.companions import Companions, DeploymentCompanions
from app.deployments.engines import service as engine_service
from app.deployments.front_door import front_doors_of
from app.deployments.models import (
    Deployment,
    DeploymentCreate,
    DeploymentList,
    DeploymentPublic,
    DeploymentUpdate,
)
from app.deployments.reactions import Reactions
from app.deployments.spares import spare_ids
from app.launchers.base import DeletedDeployment, EngineHandle, EnginesToRestart
from engine_agent.protocol import EngineConfig

router = APIRouter(prefix="/v1/deployments", tags=["deployments"], responses=problem_responses(401, 403, 422))


def _public(session: Session, deployment: Deployment, around: DeploymentCompanions) -> DeploymentPublic:
    return _publics(session, [deployment], around)[0]


def _publics(
    session: Session, deployments: Sequence[Deployment], around: DeploymentCompanions
) -> list[DeploymentPublic]:
    """The API shape of many deployments in a fixed number of queries (a deployment where an autoscaler
    intent stands is assessed on its own: few are, at any time)."""
    ids = [d.id for d in deployments]
    active = around.active_job_ids(session, ids)
    desired = around.desired(session, deployments)
    conditions = engine_service.conditions_of(session, ids)
    doors = front_doors_of(session, ids)
    spares = spare_ids(session, deployments)
    return [
        DeploymentPublic.of(
            d,
            active_job_id=active.get(d.id),
            desired=desired[d.id],
            conditions=conditions.get(d.id, []),
            front_door=doors.get(d.id),
            spare_engines=spares.get(d.id, []),
        )
        for d in deployments
    ]


@router.post("", name="create", status_code=status.HTTP_201_CREATED, responses=problem_responses(409))
async def create_deployment(
    body: DeploymentCreate,
    db: DatabaseDep,
    _: Admin,
    response: Response,
    backends: Reactions,
    around: Companions,
) -> DeploymentPublic:
    """`backend: vllm` with a `vllm.url`: the server is asked for its DP size right away (an unreachable
    one leaves the deployment `degraded`, saying why). With launcher `local`, start it with
    `POST /v1/deployments/{name}/engine/restart`."""
    created = await db.run(lambda session: service.create_deployment(session, data=body))
    await backends.deployment_created(created.name, created.backend)
    public = await db.run(
        lambda session: _public(session, service.get_deployment(session, ref=created.name), around)
    )
    response.headers["Location"] = f"/v1/deployments/{public.name}"
    return public


@router.get("", name="list")
async def list_deployments(
    db: DatabaseDep,
    _: Reader,
    around: Companions,
    limit: Annotated[int, Query(ge=1, le=listing.MAX_PAGE_SIZE)] = listing.DEFAULT_PAGE_SIZE,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> DeploymentList:
    """By name, `limit` per page; pass `next_cursor` back as `cursor` for the next page. `count` is
    every deployment's. A page is read in a fixed number of queries, whatever its size."""

    def work(session: Session) -> DeploymentList:
        page = listing.list_page(session, limit=limit, cursor=cursor)
        return DeploymentList(
            data=_publics(session, page.rows, around), count=page.count, next_cursor=page.next_cursor
        )

    return await db.run(work)


@router.get("/{name}", name="get", responses=problem_responses(404))
async def get_deployment(
    name: DeploymentRefPath, db: DatabaseDep, _: Reader, around: Companions
) -> DeploymentPublic:
    return await db.run(lambda session: _public(session, service.get_deployment(session, ref=name), around))


@router.patch("/{name}", name="update", responses=problem_responses(404))
async def update_deployment(
    name: DeploymentRefPath, body: DeploymentUpdate, db: DatabaseDep, _: Admin, around: Companions
) -> DeploymentPublic:
    def work(session: Session) -> DeploymentPublic:
        active = None
        if body.ray is not None:  # new Ray settings check for a job that may be launching engines
            active = around.active_job_id(session, service.get_deployment(session, ref=name).id)
        updated = service.update_deployment(session, ref=name, data=body, active_job_id=active)
        return _public(session, updated, around)

    return await db.run(work)


@router.delete(
    "/{name}", name="delete", status_code=status.HTTP_204_NO_CONTENT, responses=problem_responses(404, 409)
)
async def delete_deployment(
    name: DeploymentRefPath, db: DatabaseDep, _: Admin, backends: Reactions, around: Companions
) -> None:
    """Only when no job is active. Its engines are stopped by the launcher that started them (a
    static pool's are left running), and a vLLM server the local launcher runs for it too."""

    def work(session: Session) -> DeletedDeployment:
        deployment = service.get_deployment(session, ref=name)
        engines = engine_service.available_engines(session, deployment_id=deployment.id)
        deleted = DeletedDeployment(
            name=deployment.name,
            backend=deployment.backend,
            launcher=deployment.launcher,
            engine=EngineConfig.model_validate(deployment.engine_config),
            engines=tuple(EngineHandle(engine_id=e.id, url=e.url, pid=e.pid) for e in engines),
        )
        around.delete(session, name)
        return deleted

    await backends.deployment_deleted(await db.run(work))


@router.post("/{name}/agent-key", name="reveal-agent-key", responses=problem_responses(404, 409))
async def reveal_agent_key(name: DeploymentRefPath, db: DatabaseDep, _: Admin) -> AgentKeyPublic:
    """The deployment's agent key, shown once (409 `agent-key-already-shown` afterwards: rotate to see
    a new one). Static agents need it as `EPCTL_AGENT_KEY`; agents the coordinator launches get it
    from the coordinator."""
    return await db.run(lambda session: agent_keys.reveal(session, service.get_deployment(session, ref=name)))


@router.post("/{name}/agent-key/rotate", name="rotate-agent-key", responses=problem_responses(404))
async def rotate_agent_key(
    name: DeploymentRefPath,
    db: DatabaseDep,
    _: Admin,
    backends: Reactions,
    body: AgentKeyRotate | None = None,
) -> AgentKeyPublic:
    """A new agent key, shown in this answer only. Every live agent of the deployment is told it at
    once (`pushed_to`; `not_pushed` lists those that could not be, and why); the previous key stays
    accepted for `overlap_s` (10 s to 7 days), then opens nothing anywhere.

    It also repairs what it could not push: an engine that refuses every key the coordinator holds
    (condition `engine-refuses-agent-key`) is stopped by the launcher that started it (`restarted`:
    local, Ray), and self-healing replaces it with an engine launched with the new key; a static agent
    is named for its operator to restart with the new key (`restart_by_operator`)."""
    request = body or AgentKeyRotate()
    rotation = await db.run(
        lambda session: agent_keys.rotate(session, service.get_deployment(session, ref=name), request)
    )
    pushed = await push_rotation(rotation)

    def record(session: Session) -> Deployment:
        engine_service.mark_key_refused(session, pushed.refusing, refused=True)
        engine_service.mark_key_refused(session, pushed.told, refused=False)
        return service.get_deployment(session, ref=name)

    deployment = await db.run(record)
    restarted: list[str] = []
    by_launcher: dict[str, list[EngineHandle]] = {}
    for engine in rotation.engines:
        if engine.engine_id in pushed.refusing:
            handle = EngineHandle(engine_id=engine.engine_id, url=engine.url, pid=engine.pid)
            by_launcher.setdefault(engine.launched_by, []).append(handle)
    for launcher, handles in by_launcher.items():
        restart = EnginesToRestart(
            deployment=deployment.name,
            backend=deployment.backend,
            engine=EngineConfig.model_validate(deployment.engine_config),
            launcher=launcher,
            engines=tuple(handles),
        )
        restarted += await backends.restart_engines(restart)
    # Gone now: the liveness controller's next pass finds each refused the connection (its key refusal
    # already kept the deployment from being whole), an incident opens and self-healing replaces it.
    return rotation.public.model_copy(
        update={
            "pushed_to": pushed.told,
            "not_pushed": pushed.not_told,
            "restarted": restarted,
            "restart_by_operator": [e for e in pushed.refusing if e not in restarted],
        }
    )
