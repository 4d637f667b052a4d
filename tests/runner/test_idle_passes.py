"""The periodic passes over the fleet rest while nothing they read moved (issue 37: a coordinator holding
128 deployments of 16 engines took a third of a core with no request at all, in passes that read every
engine on a timer). The record's change counts (`app.core.changes`: every commit's tables; a steady
heartbeat only where it moves its engine's facts), the rules (`must_run`, the liveness pass's quiet
fleet, a table), and each pass: the liveness pass, the warm-spare keeper and the front door's publisher
run no statement over an unchanged record, and run again on a change; the liveness pass also when a
silence deadline comes with nothing written."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.api.database import Database
from app.backends.reference.liveness.controller import Liveness
from app.backends.reference.liveness.quiet import NEVER, quiet_until
from app.backends.reference.liveness.view import DeploymentView, Rules
from app.backends.reference.spares import SpareKeeper
from app.core.changes import CHANGES, STEADY_FACTS, PassGate, must_run
from app.core.clock import utc_now
from app.core.runner_settings import RunnerSettings
from app.core.stuck import Stuck
from app.deployments.engines.batch import record_batch
from app.deployments.engines.models import Engine
from app.deployments.models import Deployment, DeploymentStatus
from app.frontdoor.keeper import FEED_TABLES, publish_pass
from app.frontdoor.service import FeedMemo
from engine_agent.protocol import AgentHeartbeat, AgentState
from tests.runner.liveness_views import RULES, ago, engine, job, members, verdict, view
from tests.runner.scenario import Scenario, make_scenario
from tests.support.factories import set_row

ENGINES = (Engine.__tablename__,)


@contextlib.contextmanager
def statements(db: DbEngine) -> Iterator[list[str]]:
    """Every statement run on `db` meanwhile."""
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    sa.event.listen(db, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        sa.event.remove(db, "before_cursor_execute", note)


# --- the rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "seen", "since_full_s", "busy", "runs"),
    [
        (3, 3, 1.0, False, False),  # nothing moved, nothing in flight, a full pass lately: rests
        (4, 3, 1.0, False, True),  # a table it reads was written
        (3, None, 0.0, False, True),  # its first pass
        (3, 3, 1.0, True, True),  # its last pass left work in flight (a launch, a warm-up)
        (3, 3, 5.0, False, True),  # its last full pass is `every_s` old: another coordinator's writes
    ],
)
def test_must_run(count: int, seen: int | None, since_full_s: float, busy: bool, runs: bool) -> None:
    assert must_run(count, seen, since_full_s, busy, every_s=5.0) is runs


QUIET = view([*members(2, heard=2.0), engine("e2", "idle", heard=1.0)])
UNHEARD = replace(engine("e0", "registered"), last_heartbeat_at=None)


@pytest.mark.parametrize(
    ("seen", "until"),
    [
        # A steady ready deployment: the first deadline of the silence rules, here deafness (the freshest
        # heartbeat + half the timeout) before the oldest heartbeat + the timeout.
        (QUIET, ago(1.0) + timedelta(seconds=7.5)),
        # ... and the oldest heartbeat + the timeout where that comes first.
        (view([*members(2, heard=10.0), engine("e2", "idle", heard=1.0)]), ago(10.0) + timedelta(seconds=15)),
        (view([UNHEARD], size=0), NEVER),  # no engine heartbeated yet: none can fall silent
        (view(members(2), status="degraded", reason="members-missing"), None),
        (view(members(2), active=job("j1", "preparing")), None),  # a job's deadlines are its own
        (view([*members(2), engine("e2", "unreachable", heard=30)]), None),  # written off after a grace
        (view([*members(2), engine("e2", "fenced", heard=1)]), None),
        (view([*members(1), engine("e1", "serving", 1, link_lost_at=ago(3))]), None),
        (view([*members(1), engine("e1", "serving", 1, broken_generation=1)]), None),
        (view([*members(1), engine("e1", "serving", 1, stuck=Stuck(1, ago(2)))]), None),
        (view(members(2), heal_target_dp_size=3), None),  # a grow back to come
        (view(members(2, heard=20.0)), None),  # silent past the timeout: this verdict writes
    ],
)
def test_quiet_until(seen: DeploymentView, until: datetime | None) -> None:
    assert quiet_until([seen], [verdict(seen)], RULES) == until


# --- the change counts ---------------------------------------------------------------------------------


def test_commits_count_the_tables_they_wrote_and_nothing_else(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine)
    engine_id = stage.serving[0].engine_id
    before = CHANGES.count(ENGINES)
    set_row(db_engine, Engine, engine_id, url="http://elsewhere:1")
    assert CHANGES.count(ENGINES) == before + 1
    set_row(db_engine, Engine, engine_id, url="http://elsewhere:1")  # the same value: no net change
    assert CHANGES.count(ENGINES) == before + 1
    with Session(db_engine) as session:
        row = session.get(Engine, engine_id)
        assert row is not None
        row.url = "http://rolled-back:1"
        session.add(row)
        session.flush()
        session.rollback()
    assert CHANGES.count(ENGINES) == before + 1
    deployments = CHANGES.count((Deployment.__tablename__,))
    with Session(db_engine) as session:
        session.execute(sa.update(Deployment).values(status_detail=None))  # a statement, no object
        session.commit()
    assert CHANGES.count((Deployment.__tablename__,)) == deployments + 1
    assert CHANGES.count(ENGINES) == before + 1


def test_a_steady_heartbeat_counts_only_where_it_moves_its_engines_facts(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine)
    serving = stage.serving[0].engine_id
    beat = AgentHeartbeat(state=AgentState.serving, generation=1, rank=0, world_size=2)
    STEADY_FACTS.forget([serving])

    def recorded(heartbeat: AgentHeartbeat) -> int:
        before = CHANGES.count(ENGINES)
        with Session(db_engine) as session:
            (row,), _ = record_batch(session, [(serving, heartbeat)])
        assert row is not None
        return CHANGES.count(ENGINES) - before

    assert recorded(beat) == 1  # the first this process records of it
    assert recorded(beat) == 0  # renews the record, moves nothing a pass reads
    assert recorded(beat) == 0
    assert recorded(beat.model_copy(update={"state": AgentState.paused})) == 1
    set_row(db_engine, Engine, serving, state="serving", unresponsive_peers=["x"])  # any other writer
    assert recorded(beat) == 1  # ... is forgotten: its next steady heartbeat counts (it clears columns)
    assert recorded(beat) == 0


# --- the passes ------------------------------------------------------------------------------------------


def _quiet(stage: Scenario, heard_at: datetime) -> None:
    """Every engine of the scenario heard at `heard_at`, the deployment ready."""
    for engine_id in stage.agents:
        set_row(stage.db, Engine, engine_id, last_heartbeat_at=heard_at)
    set_row(stage.db, Deployment, stage.deployment_id, status=DeploymentStatus.ready.value)


def test_the_liveness_pass_rests_over_a_quiet_fleet_until_a_change_or_a_silence_deadline(
    db_engine: DbEngine,
) -> None:
    stage = make_scenario(db_engine)
    start = utc_now()
    _quiet(stage, start)
    silent = stage.idle[0].engine_id
    set_row(db_engine, Engine, silent, last_heartbeat_at=start - timedelta(seconds=10))
    now = [start + timedelta(seconds=1)]
    liveness = Liveness(
        stage.record,
        {"local": stage.launcher},
        Rules(),
        clock=lambda: now[0],
        watching_since=start - timedelta(hours=1),
    )

    def tick() -> tuple[int, Any]:
        with statements(db_engine) as seen:
            found = asyncio.run(liveness.tick())
        return len(seen), found

    ran, first = tick()
    assert ran and first.verdicts["demo"].writes_nothing
    assert tick()[0] == 0  # before: every engine, the jobs and the deployments read again (each second)
    assert tick()[0] == 0
    set_row(db_engine, Engine, silent, url="http://moved:1")  # a change this process wrote
    assert tick()[0] > 0
    assert tick()[0] == 0
    assert liveness.skipped == 3
    # No write: the silence deadline alone (the idle engine's last heartbeat + the timeout) brings the
    # next full pass, which writes it off.
    now[0] = start + timedelta(seconds=6)
    ran, found = tick()
    assert ran and found.verdicts["demo"].fate(silent) is not None


class KeepingPool:
    """A static pool's release: the agents stay registered, nothing is given back."""

    async def release(self, spec: Any, engines: Any) -> list[str]:
        return []


def test_the_spare_keeper_reads_nothing_until_what_it_reads_moves(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine)  # keeps no spares: its idle engine is given back (the pool keeps it)
    _quiet(stage, utc_now())
    keeper = SpareKeeper(stage.record, RunnerSettings(), {"local": KeepingPool()}, new_fleet=lambda: None)  # type: ignore[dict-item,arg-type,return-value]

    async def tick() -> int:
        with statements(db_engine) as seen:
            await keeper.tick()
            await asyncio.gather(*keeper.busy.values())
        return len(seen)

    async def passes() -> list[int]:
        read = [await tick() for _ in range(3)]  # gives the idle engine back, then sees it kept
        set_row(db_engine, Deployment, stage.deployment_id, status_detail={"reason": "anything"})
        return [*read, await tick(), await tick()]

    first, kept, resting, changed, again = asyncio.run(passes())
    assert first and kept  # the pass after a give-back runs (work was in flight)
    assert resting == 0  # before: the deployments, their active jobs and idle engines twice a second
    assert changed and again == 0
    assert keeper.gate.skipped == 2


def test_the_feed_publisher_reads_nothing_until_a_feed_may_move(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine)
    database = Database(db_engine, concurrency=1)
    gate, memo = PassGate(FEED_TABLES), FeedMemo()

    def one_pass() -> tuple[bool, int]:
        with statements(db_engine) as seen:
            ran = asyncio.run(publish_pass(database, memo, gate))
        return ran, len(seen)

    assert one_pass()[0]  # writes the first versions: its own write counts, one more pass writes nothing
    assert one_pass()[0]
    assert one_pass() == (False, 0)  # before: every engine's columns, the jobs, the versions (4 a second)
    assert gate.skipped == 1
    set_row(db_engine, Engine, stage.serving[1].engine_id, state="unreachable")
    ran, read = one_pass()  # writes the next version
    assert ran and read
    assert one_pass()[0]
    assert one_pass() == (False, 0)
