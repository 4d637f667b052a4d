"""What this process changed in the record, per table (issue 37: the periodic passes that read the whole
fleet on a timer run only when something they read may have moved).

Every commit of a session that wrote a table bumps that table's counter, after the commit (a pass that
reads on seeing the new count reads the change). A pass keeps the count it last read at
(`Changes.count`) and compares it with the count now: equal, nothing this process wrote moved its
inputs. Found by the ORM's own events, so no writer has to remember to ring:

- `after_flush`: the tables of the objects added, changed (with a net change) or deleted;
- `do_orm_execute`: the table of an `insert` / `update` / `delete` statement run through a session (a
  textual statement's table is unknown: it counts for every table, `ANY`);
- `after_commit` bumps what the transaction wrote; a rollback forgets it.

The steady heartbeats' statement runs on the session's connection (no ORM event): their writer says
itself which heartbeats moved an engine's facts (`SteadyFacts`); a steady heartbeat that renews its
engine's record and changes nothing else bumps nothing, so a fleet heartbeating as usual wakes no pass.

Process-local: another coordinator's writes are not counted here. The passes that skip on an unchanged
count still run in full at least every `FULL_PASS_EVERY_S` (another coordinator's change is seen by its
own passes at once, and by this one's within that bound).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session

ANY = "*"  # a write whose table is unknown: counts as a change of every table
FULL_PASS_EVERY_S = 5.0  # a pass skipping on unchanged counts still runs in full this often
_WRITTEN = "epctl.changes.written"  # session.info key: the tables the open transaction wrote
ENGINES = "engines"


class Changes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def bump(self, tables: Iterable[str]) -> None:
        with self._lock:
            for table in tables:
                self._counts[table] = self._counts.get(table, 0) + 1

    def count(self, tables: Collection[str]) -> int:
        """The writes to these tables so far (a sum of counters that only grow: equal means none)."""
        with self._lock:
            return sum(self._counts.get(t, 0) for t in (*tables, ANY))


CHANGES = Changes()


class SteadyFacts:
    """What this process last recorded of each engine through a steady heartbeat (its state, generation,
    rank and world size): a heartbeat that reports the same renews the record and changes nothing a pass
    reads. An engine written any other way (an ORM write: the whole heartbeat path, a job, the liveness
    pass) is forgotten, so its next steady heartbeat counts as a change whatever it says (the steady
    statement also clears columns that other write set)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts: dict[str, Hashable] = {}

    def moved(self, engine_id: str, facts: Hashable) -> bool:
        """Note the engine's facts as a steady heartbeat recorded them; whether they differ from the last."""
        with self._lock:
            before = self._facts.get(engine_id)
            self._facts[engine_id] = facts
        return before != facts

    def forget(self, engine_ids: Iterable[str]) -> None:
        with self._lock:
            for engine_id in engine_ids:
                self._facts.pop(engine_id, None)


STEADY_FACTS = SteadyFacts()


def _table_of(entity: Any) -> str | None:
    return getattr(getattr(entity, "__table__", None), "name", None)


@event.listens_for(Session, "after_flush")
def _after_flush(session: Session, _context: Any) -> None:
    written: set[str] = session.info.setdefault(_WRITTEN, set())
    engines: list[str] = []
    for obj in [*session.new, *session.deleted, *(o for o in session.dirty if session.is_modified(o))]:
        table = _table_of(obj)
        written.add(table or ANY)
        if table == ENGINES:
            engines.append(str(getattr(obj, "id", "")))
    if engines:
        STEADY_FACTS.forget(engines)


@event.listens_for(Session, "do_orm_execute")
def _do_orm_execute(state: ORMExecuteState) -> None:
    if not (state.is_insert or state.is_update or state.is_delete):
        if isinstance(state.statement, sa.TextClause) and _writes(state.statement.text):
            state.session.info.setdefault(_WRITTEN, set()).add(ANY)
        return
    table = getattr(getattr(state.statement, "table", None), "name", None)
    state.session.info.setdefault(_WRITTEN, set()).add(table or ANY)


def _writes(sql: str) -> bool:
    words = sql.split(None, 1)
    return bool(words) and words[0].upper() in {"INSERT", "UPDATE", "DELETE", "REPLACE"}


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    written = session.info.pop(_WRITTEN, None)
    if written:
        CHANGES.bump(written)


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop(_WRITTEN, None)


def note_steady(rows: Iterable[Any]) -> bool:
    """The steady heartbeats just committed (their returned engine rows; None: not recorded): engines
    counted as changed where one moved its facts; whether any did."""
    moved = False
    for row in rows:
        facts = None if row is None else (row.state, row.generation, row.dp_rank, row.world_size)
        if row is not None and STEADY_FACTS.moved(row.id, facts):
            moved = True
    if moved:
        CHANGES.bump([ENGINES])
    return moved


def must_run(count: int, seen: int | None, since_full_s: float, busy: bool, every_s: float) -> bool:
    """A periodic pass runs in full where its tables moved since it last ran (`count` != `seen`), it left
    work in flight (`busy`), or its last full pass is `every_s` old (pure)."""
    return busy or seen is None or count != seen or since_full_s >= every_s


@dataclass
class PassGate:
    """One periodic pass's memory of its last full run: `start` says whether this one must run (and the
    count to give `ran` once it did), `ran` records it; `skipped` counts the passes saved."""

    tables: tuple[str, ...]
    every_s: float = FULL_PASS_EVERY_S
    seen: int | None = None
    full_at: float = float("-inf")
    skipped: int = 0

    def start(self, busy: bool = False) -> tuple[int, float] | None:
        count, now = CHANGES.count(self.tables), time.monotonic()
        if must_run(count, self.seen, now - self.full_at, busy, self.every_s):
            return count, now
        self.skipped += 1
        return None

    def ran(self, started: tuple[int, float]) -> None:
        """The pass begun at `started` ran to its end (a failed one runs again next time)."""
        self.seen, self.full_at = started
