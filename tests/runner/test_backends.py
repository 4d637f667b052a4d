"""The backend seam (`app.backends.base.Backends`): a job, a new deployment and a deleted one each reach
the backend of their own deployment, and no other."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.backends.base import Backend, Backends
from app.deployments.models import EngineBackend, LauncherKind
from app.launchers.base import DeletedDeployment
from engine_agent.protocol import EngineConfig
from tests.support.factories import make_deployment, make_job, static_deployment


@dataclass
class Heard:
    """What a recording backend was told, in order."""

    calls: list[tuple[str, str]] = field(default_factory=list)


def recording(kind: EngineBackend, heard: Heard) -> Backend:
    class Recording(Backend):
        async def run(self, job_id: str) -> None:
            heard.calls.append((f"{kind.value}.run", job_id))

        async def reconcile(self, job_id: str) -> None:
            heard.calls.append((f"{kind.value}.reconcile", job_id))

        async def deployment_created(self, name: str) -> None:
            heard.calls.append((f"{kind.value}.created", name))

        async def deployment_deleted(self, deleted: DeletedDeployment) -> None:
            heard.calls.append((f"{kind.value}.deleted", deleted.name))

    Recording.kind = kind
    return Recording()


def both(db: DbEngine, heard: Heard) -> Backends:
    return Backends(db, [recording(EngineBackend.reference, heard), recording(EngineBackend.vllm, heard)])


def deleted(name: str, backend: EngineBackend) -> DeletedDeployment:
    return DeletedDeployment(
        name=name, backend=backend.value, launcher="local", engine=EngineConfig(), engines=()
    )


def test_a_job_runs_and_is_reconciled_through_its_deployments_backend(db_engine: DbEngine) -> None:
    with Session(db_engine) as session:
        reference_job = make_job(session, static_deployment(session, "agents"), 1).id
        served = make_deployment(
            session,
            "served",
            backend=EngineBackend.vllm,
            launcher=LauncherKind.static,
            vllm={"url": "http://x:1"},
        )
        served.current_dp_size = 1  # as observed from its server
        session.add(served)
        session.commit()
        vllm_job = make_job(session, served, 2).id
    heard = Heard()
    backends = both(db_engine, heard)

    async def go() -> None:
        await backends.run(vllm_job)
        await backends.run(reference_job)
        await backends.reconcile(vllm_job)

    asyncio.run(go())
    assert heard.calls == [
        ("vllm.run", vllm_job),
        ("reference.run", reference_job),
        ("vllm.reconcile", vllm_job),
    ]


def test_a_deployment_coming_and_going_is_told_to_its_own_backend_only(db_engine: DbEngine) -> None:
    heard = Heard()
    backends = both(db_engine, heard)

    async def go() -> None:
        await backends.deployment_created("served", EngineBackend.vllm.value)
        await backends.deployment_deleted(deleted("agents", EngineBackend.reference))
        await backends.deployment_deleted(deleted("served", EngineBackend.vllm))

    asyncio.run(go())
    assert heard.calls == [
        ("vllm.created", "served"),
        ("reference.deleted", "agents"),
        ("vllm.deleted", "served"),
    ]


def test_a_backend_this_coordinator_does_not_run_hears_nothing(db_engine: DbEngine) -> None:
    heard = Heard()
    backends = Backends(db_engine, [recording(EngineBackend.reference, heard)])

    async def go() -> None:
        await backends.deployment_created("served", EngineBackend.vllm.value)
        await backends.deployment_deleted(deleted("served", EngineBackend.vllm))

    asyncio.run(go())
    assert heard.calls == []
