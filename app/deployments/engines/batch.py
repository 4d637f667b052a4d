"""Steady heartbeats recorded together: one database call, one transaction, one commit (issue 37).

A heartbeat that only renews its engine's record (`service.record_steady_heartbeat`'s kind) joins the
batch being gathered; one writer per event loop takes every heartbeat waiting when it starts (at most
`max_batch`), writes each one's statement on one connection and commits once, then answers them all;
the heartbeats that came meanwhile are the next batch. At low rates a batch is one heartbeat and
nothing waits longer than before; at 700 a second (2,048 engines every 3 s) one commit and one worker
thread hop serve tens of heartbeats, and the heartbeats no longer queue for SQLite's one write lock
(each connection waiting for it sleeps in the busy handler, holding a database slot: the cause of the
2,048-engine collapse, with the periodic passes that read every deployment).

The record stays exact: every heartbeat is answered only after the commit that holds it, so neither
this coordinator's liveness pass nor another coordinator on the same database, nor a restart, ever
sees an answered heartbeat missing from the rows. A heartbeat the batch cannot take (its engine
unknown, left or with its control link lost, or its key verdict moving) comes back as None and goes
the whole way (`service.record_heartbeat`), as before; what the batch wrote for it is a subset of
what that path writes for the same heartbeat.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy.engine import Row
from sqlmodel import Session

from app.api.database import Database
from app.coordinators import service as coordinators
from app.core import changes
from app.core.clock import utc_now
from app.deployments.engines import service, steady
from engine_agent.protocol import AgentHeartbeat

MAX_BATCH = 256


@dataclass(frozen=True)
class Recorded:
    """A steady heartbeat written and committed: its row (as `record_steady_heartbeat` returns it) and
    the live coordinators for its answer."""

    row: Row[Any]
    coordinators: list[str]


@dataclass
class _Waiting:
    engine_id: str
    heartbeat: AgentHeartbeat
    answer: asyncio.Future[Recorded | None]
    since: float  # monotonic: when it joined


@dataclass
class _Queue:
    waiting: list[_Waiting] = field(default_factory=list)
    writer: asyncio.Task[None] | None = None
    writing_since: float | None = None  # the oldest heartbeat of the batch being written


def record_batch(
    session: Session, beats: Sequence[tuple[str, AgentHeartbeat]], now: datetime | None = None
) -> tuple[list[Row[Any] | None], list[str]]:
    """Every heartbeat's steady write in one `executemany`, the rows written read back in one SELECT, then
    one commit: the rows (None where the heartbeat needs the whole path) and the live coordinators. (One
    UPDATE ... RETURNING per heartbeat cost more in SQLAlchemy's execution path per statement than in the
    database: issue 37.) A row the write's conditions left alone (left, fenced, its link lost) keeps its
    older `last_heartbeat_at`, so the read does not return it: that heartbeat takes the whole path."""
    at = now or utc_now()
    params = [service.steady_params(engine_id, heartbeat, at) for engine_id, heartbeat in beats]
    wanted = [p for p in params if p is not None]
    found: dict[str, Row[Any]] = {}
    if wanted:
        connection = session.connection()
        connection.execute(steady.steady_update(), wanted)
        ids = sorted({p["engine_id"] for p in wanted})
        found = {row.id: row for row in connection.execute(steady.steady_read(), {"ids": ids, "at": at})}
    written = [None if p is None else found.get(p["engine_id"]) for p in params]
    rows = [
        None if row is None or service.key_verdict_moves(row, heartbeat.key_check, at) else row
        for row, (_, heartbeat) in zip(written, beats, strict=True)
    ]
    session.commit()
    # Past the ORM's events: the periodic passes wake only for an engine whose facts moved (issue 37).
    changes.note_steady(written)
    return rows, coordinators.live_urls_recent(session)


class HeartbeatBatches:
    """The steady heartbeats' writer (one per event loop: a server runs one)."""

    def __init__(self, database: Database, *, max_batch: int = MAX_BATCH) -> None:
        self.database = database
        self.max_batch = max_batch
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue] = (
            weakref.WeakKeyDictionary()
        )

    async def record(
        self, engine_id: str, heartbeat: AgentHeartbeat, on_queued: Callable[[], None] | None = None
    ) -> Recorded | None:
        """The heartbeat written and committed with its batch, or None (nothing written that the whole
        path would not write) when it needs `service.record_heartbeat`. `on_queued` is called once it
        waits for its batch (the request then leaves the admission gate: `app.core.limits.LEAVE_GATE`)."""
        if not service.is_steady(heartbeat):
            return None
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = _Queue()
        answer: asyncio.Future[Recorded | None] = loop.create_future()
        queue.waiting.append(_Waiting(engine_id, heartbeat, answer, time.monotonic()))
        if queue.writer is None or queue.writer.done():
            queue.writer = loop.create_task(self._write(queue), name="heartbeat-batches")
        if on_queued is not None:
            on_queued()
        return await answer

    def backlog_age_s(self) -> float:
        """How long the oldest heartbeat waiting for its commit (queued, or in the batch being written)
        on this event loop has waited; 0 when none waits. The shedding rule reads it beside the gate's
        queue (`app.core.shedding.shed_now`): heartbeats wait here, not at the gate."""
        try:
            queue = self._queues.get(asyncio.get_running_loop())
        except RuntimeError:
            return 0.0
        if queue is None:
            return 0.0
        oldest = [t for t in (queue.writing_since, queue.waiting[0].since if queue.waiting else None) if t]
        return time.monotonic() - min(oldest) if oldest else 0.0

    async def _write(self, queue: _Queue) -> None:
        while queue.waiting:
            batch, queue.waiting = queue.waiting[: self.max_batch], queue.waiting[self.max_batch :]
            beats = [(w.engine_id, w.heartbeat) for w in batch]
            queue.writing_since = batch[0].since
            try:
                rows, live = await self.database.run(partial(record_batch, beats=beats))
            except asyncio.CancelledError:
                queue.writing_since = None
                for w in [*batch, *queue.waiting]:
                    w.answer.cancel()
                queue.waiting.clear()
                raise
            except Exception as exc:  # the database failed the batch: each heartbeat's request fails
                queue.writing_since = None
                for w in batch:
                    if not w.answer.done():
                        w.answer.set_exception(exc)
                continue
            queue.writing_since = None
            for w, row in zip(batch, rows, strict=True):
                if not w.answer.done():  # a request whose client left was cancelled meanwhile
                    w.answer.set_result(None if row is None else Recorded(row, live))
