"""Steady heartbeats written together (`app.deployments.engines.batch`, issue 37): the heartbeats waiting
at once go in one transaction with one commit, every one is recorded and answered only after that
commit, and one that needs the whole path is handed back without failing the others."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.api.database import Database
from app.core.clock import utc_now
from app.deployments.engines.batch import HeartbeatBatches, record_batch
from app.deployments.engines.fast_path import answer_of
from app.deployments.engines.models import Engine, EngineHeartbeatAnswer
from engine_agent.protocol import AgentHeartbeat
from tests.support.factories import set_row
from tests.support.fleet import make_fleet

ENGINES = 16


def _beat(i: int, generation: int = 4) -> AgentHeartbeat:
    return AgentHeartbeat.model_validate(
        {"state": "serving", "generation": generation, "rank": i, "world_size": ENGINES}
    )


class Statements:
    """The UPDATEs and the commits the database engine runs."""

    def __init__(self, engine: DbEngine) -> None:
        self.updates = 0
        self.commits = 0
        sa.event.listen(engine, "before_cursor_execute", self._statement)
        sa.event.listen(engine, "commit", self._commit)

    def _statement(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE ENGINES"):
            self.updates += 1

    def _commit(self, _conn: Any) -> None:
        self.commits += 1


@pytest.mark.databases("sqlite", "postgres")  # the write and its read-back, on each
def test_heartbeats_waiting_at_once_are_one_transaction(client: TestClient) -> None:
    make_fleet(client, ENGINES)
    database: Database = client.app.state.database  # type: ignore[attr-defined]
    batches = HeartbeatBatches(database)
    counted = Statements(database.engine)

    async def all_at_once() -> list[Any]:
        return await asyncio.gather(*(batches.record(f"e{i}", _beat(i)) for i in range(ENGINES)))

    recorded = asyncio.run(all_at_once())
    assert all(r is not None for r in recorded)
    assert [r.row.id for r in recorded] == [f"e{i}" for i in range(ENGINES)]
    # One executemany for the batch (one UPDATE ... RETURNING per heartbeat before; 16 commits before that)
    assert (counted.updates, counted.commits) == (1, 1)
    with Session(database.engine) as session:
        rows = session.exec(select(Engine)).all()
    assert sorted((r.id, r.generation, r.state) for r in rows) == sorted(
        (f"e{i}", 4, "serving") for i in range(ENGINES)
    )


def test_a_heartbeat_the_batch_cannot_take_comes_back_alone(client: TestClient) -> None:
    make_fleet(client, ENGINES)
    database: Database = client.app.state.database  # type: ignore[attr-defined]
    batches = HeartbeatBatches(database)
    broken = AgentHeartbeat.model_validate(
        {"state": "serving", "generation": 4, "broken_generation": 4, "unresponsive_peers": ["e1"]}
    )

    async def mixed() -> list[Any]:
        return await asyncio.gather(  # type: ignore[return-value]
            batches.record("e0", _beat(0)),
            batches.record("ghost", _beat(1)),  # unknown: the whole path answers 404
            batches.record("e2", broken),  # a broken group: never the steady path
            batches.record("e3", _beat(3)),
        )

    first, ghost, broke, last = asyncio.run(mixed())
    assert ghost is None and broke is None
    assert first is not None and last is not None
    with Session(database.engine) as session:
        generations = {r.id: r.generation for r in session.exec(select(Engine)).all()}
    assert (generations["e0"], generations["e3"], generations["e2"]) == (4, 4, 0)


@pytest.mark.databases("sqlite", "postgres")  # the write and its read-back, on each
def test_an_engine_the_write_leaves_alone_comes_back_and_keeps_its_record(client: TestClient) -> None:
    """One write for the batch, its rows read back: an engine whose row the write's conditions leave alone
    (its control link lost, fenced, left) is not read back as written; it takes the whole path."""
    make_fleet(client, ENGINES)
    database: Database = client.app.state.database  # type: ignore[attr-defined]
    lost_at = utc_now() - timedelta(seconds=5)
    set_row(database.engine, Engine, "e1", link_lost_at=lost_at, generation=2)
    set_row(database.engine, Engine, "e2", state="fenced", generation=2)
    batches = HeartbeatBatches(database)

    async def at_once() -> list[Any]:
        return await asyncio.gather(*(batches.record(f"e{i}", _beat(i)) for i in range(4)))

    recorded = asyncio.run(at_once())
    assert [r is None for r in recorded] == [False, True, True, False]
    with Session(database.engine) as session:
        generations = {r.id: r.generation for r in session.exec(select(Engine)).all()}
    assert [generations[f"e{i}"] for i in range(4)] == [4, 2, 2, 4]


def test_every_heartbeat_sent_at_once_through_the_api_is_recorded(client: TestClient) -> None:
    """Through the route, concurrently: every heartbeat answered 200 with its own engine's row."""
    make_fleet(client, ENGINES)
    transport_app = client.app

    async def send_all() -> list[Any]:
        import httpx

        transport = httpx.ASGITransport(app=transport_app)  # type: ignore[arg-type]
        headers = dict(client.headers)
        async with httpx.AsyncClient(transport=transport, base_url="http://c", headers=headers) as http:
            return await asyncio.gather(
                *(
                    http.post(f"/v1/engines/e{i}/heartbeat", json=_beat(i, generation=7).model_dump())
                    for i in range(ENGINES)
                )
            )

    answers = asyncio.run(send_all())
    assert [a.status_code for a in answers] == [200] * ENGINES
    assert [(a.json()["id"], a.json()["generation"], a.json()["deployment"]) for a in answers] == [
        (f"e{i}", 7, "demo") for i in range(ENGINES)
    ]


def test_a_heartbeat_is_told_once_queued_and_the_backlog_ages_until_its_commit(client: TestClient) -> None:
    """`on_queued` (the request leaves the admission gate) comes once the heartbeat waits for its batch;
    the backlog's age (read by the shedding rule) is 0 once every heartbeat is committed."""
    make_fleet(client, ENGINES)
    database: Database = client.app.state.database  # type: ignore[attr-defined]
    batches = HeartbeatBatches(database)

    async def one() -> tuple[list[float], float, float]:
        queued: list[float] = []
        idle = batches.backlog_age_s()
        told = lambda: queued.append(batches.backlog_age_s())  # noqa: E731
        recorded = await batches.record("e0", _beat(0), on_queued=told)
        assert recorded is not None
        return queued, idle, batches.backlog_age_s()

    queued, before, after = asyncio.run(one())
    assert len(queued) == 1 and queued[0] >= 0.0
    assert before == 0.0 and after == 0.0


def test_the_answer_read_from_the_rows_mapping_is_the_rows_shape(client: TestClient) -> None:
    """`fast_path.answer_of` (a dict to pydantic) equals `EngineHeartbeatAnswer.of` (attribute reads)."""
    make_fleet(client, ENGINES)
    database: Database = client.app.state.database  # type: ignore[attr-defined]
    set_row(database.engine, Engine, "e3", pid=41, hostname="h", data_host="10.0.0.3")
    with Session(database.engine) as session:
        (row, plain), live = record_batch(session, [("e3", _beat(3)), ("e4", _beat(4))])
    for written in (row, plain):
        assert written is not None
        expected = EngineHeartbeatAnswer.of(written, deployment=written.deployment, coordinators=live)
        assert answer_of(written, live).model_dump_json() == expected.model_dump_json()
        assert answer_of(written, live).deployment == "demo"
