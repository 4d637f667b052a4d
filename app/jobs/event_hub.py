"""What keeps live SSE streams cheap: one poll of the jobs table per interval for every idle stream.

An SSE stream (`events_router`) reads its job's log rows through the hub and, once it has sent
everything, waits in `wait_for_change` holding neither a connection nor a thread. One poller task per
coordinator reads `last_event_seq` and `state` of every job being watched in one query per
`poll_s` and wakes the streams of the jobs that moved; streams resuming from the same point share one
read. The database stays the source of truth (a job advanced by another coordinator is seen the same
way), and 1,000 idle streams cost one small query per interval instead of 4,000.

It also counts open streams: per token (`max_per_token`, then 429) and in all (`max_streams`, then
503), so that no caller can hold every worker and file descriptor with streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.api.database import Database
from app.core.errors import TooManyRequestsError, UnavailableError
from app.jobs.models import JobEvent, ReconfigurationJob

log = logging.getLogger(__name__)

PAGE_SIZE = 500
_WATCH_QUERY_CHUNK = 500


class TooManyStreamsError(TooManyRequestsError):
    code = "too-many-streams"
    title = "Too many event streams"


class StreamCapacityError(UnavailableError):
    code = "stream-capacity-reached"


@dataclass
class _Watch:
    subscribers: int = 0
    polled: bool = False  # once polled, last_seq None means the job is gone
    last_seq: int | None = None
    state: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class LogPage:
    state: str | None  # None: the job does not exist (any more)
    rows: list[JobEvent]


def read_after(session: Session, job_id: str, after_seq: int) -> LogPage:
    """(the job's state, its rows after `after_seq`). The state is read first: if it is terminal, the
    rows read after it include the terminal transition."""
    job = session.get(ReconfigurationJob, job_id)
    if job is None:
        return LogPage(None, [])
    rows = session.exec(
        select(JobEvent)
        .where(col(JobEvent.job_id) == job_id, col(JobEvent.seq) > after_seq)
        .order_by(col(JobEvent.seq))
        .limit(PAGE_SIZE)
    ).all()
    return LogPage(job.state, list(rows))


def _positions(session: Session, *, job_ids: list[str]) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    table = ReconfigurationJob.__table__  # type: ignore[attr-defined]
    for start in range(0, len(job_ids), _WATCH_QUERY_CHUNK):
        chunk = job_ids[start : start + _WATCH_QUERY_CHUNK]
        rows = session.execute(
            sa.select(table.c.id, table.c.last_event_seq, table.c.state).where(table.c.id.in_(chunk))
        ).all()
        found.update({str(job_id): (int(seq), str(state)) for job_id, seq, state in rows})
    return found


class JobLogHub:
    def __init__(self, database: Database, *, poll_s: float, max_streams: int, max_per_token: int) -> None:
        self.database = database
        self.poll_s = poll_s
        self.max_streams = max_streams
        self.max_per_token = max_per_token
        self._watches: dict[str, _Watch] = {}
        self._reads: dict[tuple[str, int], asyncio.Future[LogPage]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._streams_by_token: dict[str, int] = {}
        self.open_streams = 0

    # --- stream accounting -------------------------------------------------------------------------

    @contextlib.contextmanager
    def stream_slot(self, token_id: str) -> Iterator[None]:
        """Hold one stream's place for as long as it is open; refuses beyond the limits."""
        held = self._streams_by_token.get(token_id, 0)
        if held >= self.max_per_token:
            raise TooManyStreamsError(
                f"this token already holds {held} open event streams (the limit is {self.max_per_token}); "
                "close one, or use another token",
                limit=self.max_per_token,
            )
        if self.open_streams >= self.max_streams:
            raise StreamCapacityError(
                f"the coordinator holds its maximum of {self.max_streams} event streams; retry later",
                limit=self.max_streams,
            )
        self._streams_by_token[token_id] = held + 1
        self.open_streams += 1
        try:
            yield
        finally:
            self.open_streams -= 1
            left = self._streams_by_token[token_id] - 1
            if left:
                self._streams_by_token[token_id] = left
            else:
                del self._streams_by_token[token_id]

    # --- reading -----------------------------------------------------------------------------------

    async def read_after(self, job_id: str, after_seq: int) -> LogPage:
        """One read per (job, resume point) at a time, shared by every stream asking for it."""
        key = (job_id, after_seq)
        pending = self._reads.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self.database.run(lambda s: read_after(s, job_id, after_seq)))
            self._reads[key] = pending
            pending.add_done_callback(lambda _: self._reads.pop(key, None))
        return await asyncio.shield(pending)

    async def wait_for_change(self, job_id: str, seen_seq: int) -> None:
        """Return once the job's newest log row is past `seen_seq` (or the job changed or vanished)."""
        watch = self._watches.setdefault(job_id, _Watch())
        watch.subscribers += 1
        try:
            self._ensure_poller()
            while not (watch.polled and (watch.last_seq is None or watch.last_seq > seen_seq)):
                await watch.changed.wait()
        finally:
            watch.subscribers -= 1
            if watch.subscribers == 0:
                self._watches.pop(job_id, None)

    # --- the poller --------------------------------------------------------------------------------

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll(), name="job-log-hub")

    async def _poll(self) -> None:
        while self._watches:
            job_ids = list(self._watches)
            try:
                positions = await self.database.run(functools.partial(_positions, job_ids=job_ids))
            except Exception:  # the database is away: keep the streams, try again next interval
                log.warning("event streams: reading job positions failed", exc_info=True)
                positions = None
            if positions is not None:
                for job_id in job_ids:
                    watch = self._watches.get(job_id)
                    if watch is None:
                        continue
                    now = positions.get(job_id)
                    seq, state = now if now is not None else (None, None)
                    if not watch.polled or seq != watch.last_seq or state != watch.state:
                        watch.polled, watch.last_seq, watch.state = True, seq, state
                        fired, watch.changed = watch.changed, asyncio.Event()
                        fired.set()
            await asyncio.sleep(self.poll_s)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._poller
