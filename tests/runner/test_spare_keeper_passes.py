"""The warm-spare keeper's passes at fleet scale (issue 37): an idle engine that a static pool keeps when
it is given back is offered once, not at every pass (it was: 1,093 "giving back" lines and a release
call per deployment every 0.5 s at 128 deployments); a pass reads any number of deployments in the same
few queries."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.backends.reference.spares import SpareKeeper, needs
from app.core.runner_settings import RunnerSettings
from app.deployments.models import Deployment, DeploymentStatus
from app.jobs.async_record import WorkerSessions
from app.launchers.base import EngineHandle, LaunchSpec
from tests.support.fleet import make_fleet


class KeepingPool:
    """A static pool's release: the agents stay registered, nothing is given back."""

    name = "static"

    def __init__(self) -> None:
        self.released: list[list[str]] = []

    async def release(self, spec: LaunchSpec, engines: Sequence[EngineHandle]) -> list[str]:
        self.released.append([h.engine_id for h in engines])
        return []


def _deployments(client: TestClient, count: int, idle: int) -> None:
    """`count` ready static deployments keeping no spares, each with `idle` registered engines."""
    for d in range(count):
        make_fleet(client, idle, f"d{d}", engine_prefix=f"d{d}-")
    engine = client.app.state.db_engine  # type: ignore[attr-defined]
    with Session(engine) as session:
        for deployment in session.exec(select(Deployment)).all():
            deployment.status = DeploymentStatus.ready.value
            session.add(deployment)
        session.commit()


def test_engines_a_static_pool_keeps_are_given_back_once(client: TestClient) -> None:
    _deployments(client, count=2, idle=2)
    pool = KeepingPool()
    keeper = SpareKeeper(
        WorkerSessions(client.app.state.db_engine),  # type: ignore[attr-defined]
        RunnerSettings(),
        {"static": pool},  # type: ignore[dict-item]
        new_fleet=lambda: None,  # type: ignore[arg-type,return-value]
    )

    async def passes(n: int) -> None:
        for _ in range(n):
            await keeper.tick()
            await asyncio.gather(*keeper.busy.values())

    asyncio.run(passes(3))
    assert sorted(map(sorted, pool.released)) == [["d0-e0", "d0-e1"], ["d1-e0", "d1-e1"]]


def test_a_pass_reads_any_number_of_deployments_in_the_same_queries(client: TestClient) -> None:
    engine = client.app.state.db_engine  # type: ignore[attr-defined]
    selects: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            selects.append(statement)

    def queries() -> int:
        selects.clear()
        sa.event.listen(engine, "before_cursor_execute", count)
        try:
            with Session(engine) as session:
                needs(session, RunnerSettings())
        finally:
            sa.event.remove(engine, "before_cursor_execute", count)
        return len(selects)

    _deployments(client, count=1, idle=2)
    one = queries()
    _deployments_more = [f"d{d}" for d in range(1, 9)]
    for name in _deployments_more:
        assert client.post("/v1/deployments", json={"name": name, "launcher": "static"}).status_code == 201
    with Session(engine) as session:
        for deployment in session.exec(select(Deployment)).all():
            deployment.status = DeploymentStatus.ready.value
            session.add(deployment)
        session.commit()
    assert queries() == one  # before: two more per deployment (its active job, its engines)
