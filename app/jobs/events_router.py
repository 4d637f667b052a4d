"""`GET /v1/reconfigurations/{id}/events`: a job's log as Server-Sent Events (FastAPI's own SSE support).

One event per log row (transitions and progress/phase/engine notes), in `seq` order: `id:` is the row's
`seq`, `event:` its kind, `data:` the row as JSON. A client that reconnects with `Last-Event-ID` (or
`?last_event_id=`) gets exactly the rows after that one. Once the job is terminal and every row up to
its terminal transition has been sent, one last `event: end` (no id, so a resume point is unchanged)
says so and the stream closes; a client should stop reconnecting when it sees it.

A stream holds no database connection and no thread while it waits: it reads rows through the
coordinator's `JobLogHub` (one short read per change, shared by streams at the same point) and sleeps
until the hub's poller sees the job move. The rows are the source of truth, wherever the runner that
writes them lives. A token may hold `events_max_streams_per_token` streams at once (429 beyond), the
coordinator `events_max_streams` (503 beyond). A stream lasts only as long as its token: it asks every
`events_token_recheck_s` whether the token was revoked since, and if so sends `event: revoked` and
closes (the token opens no door after its end, a stream held open included).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent

from app.api.deps import DatabaseDep, Reader, SettingsDep
from app.api.params import INT32_MAX, INT64_MAX, JobIdPath
from app.core.errors import InvalidRequestError
from app.core.problems import problem_responses
from app.jobs.event_hub import PAGE_SIZE, JobLogHub, LogPage
from app.jobs.models import JobEvent, JobEventPublic
from app.jobs.states import TERMINAL_STATES, JobNotFoundError, JobState
from app.tokens import service as tokens

router = APIRouter(
    prefix="/v1/reconfigurations",
    tags=["reconfigurations"],
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)

END_EVENT = "end"
REVOKED_EVENT = "revoked"
RETRY_MS = 1000  # tells EventSource how soon to reconnect after a drop


def event_of(job_id: str, row: JobEvent) -> ServerSentEvent:
    """One log row as an SSE event: id = seq, event = kind, data = the row (with the job's id)."""
    data = {"job_id": job_id, **JobEventPublic.model_validate(row).model_dump(mode="json")}
    return ServerSentEvent(id=str(row.seq), event=row.kind, data=data)


def end_event(job_id: str, state: str, last_seq: int) -> ServerSentEvent:
    return ServerSentEvent(
        event=END_EVENT, data={"job_id": job_id, "state": state, "last_event_id": last_seq}
    )


def resume_point(header_value: str | None, query_value: int | None) -> int:
    """The seq to resume after: the `Last-Event-ID` header wins over `?last_event_id=`; none means 0."""
    if header_value is not None and header_value.strip():
        text = header_value.strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) > INT64_MAX:
            raise InvalidRequestError(
                f"Last-Event-ID {text[:40]!r} is not an event id of this stream (an integer from 0 to "
                f"{INT64_MAX})",
                code="invalid-last-event-id",
            )
        return int(text)
    return query_value or 0


StillLive = Callable[[], Awaitable[bool]]


async def follow(
    hub: JobLogHub,
    job_id: str,
    after_seq: int,
    first_page: LogPage | None = None,
    *,
    still_live: StillLive | None = None,
    recheck_s: float = 5.0,
) -> AsyncIterator[ServerSentEvent]:
    """The stream itself, independent of HTTP: rows after `after_seq` as they appear, then `end`.
    With `still_live` (the caller's token), asked at most every `recheck_s` and at least that often
    while nothing happens: once it says no, `revoked` and the stream ends."""
    first = True
    page = first_page
    checked_at = time.monotonic()
    while True:
        if still_live is not None and time.monotonic() - checked_at >= recheck_s:
            if not await still_live():
                yield ServerSentEvent(event=REVOKED_EVENT, data={"job_id": job_id, "code": "token-revoked"})
                return
            checked_at = time.monotonic()
        if page is None:
            page = await hub.read_after(job_id, after_seq)
        state = page.state
        if state is None:
            return
        for row in page.rows:
            event = event_of(job_id, row)
            if first:
                event.retry = RETRY_MS
                first = False
            yield event
            after_seq = row.seq
        if len(page.rows) == PAGE_SIZE:
            page = None
            continue  # more rows are waiting: no pause, no end yet
        if JobState(state) in TERMINAL_STATES:
            yield end_event(job_id, state, after_seq)
            return
        page = None
        if still_live is None:
            await hub.wait_for_change(job_id, after_seq)
        else:
            with contextlib.suppress(TimeoutError):  # wake up to ask about the token again
                await asyncio.wait_for(hub.wait_for_change(job_id, after_seq), max(recheck_s, 0.01))


async def job_log_hub(request: Request) -> JobLogHub:
    hub: JobLogHub = request.app.state.job_log_hub
    return hub


async def stream_slot(
    principal: Reader, hub: Annotated[JobLogHub, Depends(job_log_hub)]
) -> AsyncIterator[None]:
    """The stream's place among the token's and the coordinator's open streams, held until it ends."""
    with hub.stream_slot(principal.token_id):
        yield


_SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the job's log as Server-Sent Events; `id:` is the row's seq, `event:` its kind "
        "(`transition`, `progress`, ...), `data:` the row as JSON; a final `event: end` when the job is over",
    }
}


async def resume_after(
    last_event_id_header: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            description="resume after this event id (EventSource sends it): an integer from 0 to 2^63-1",
        ),
    ] = None,
    last_event_id: Annotated[
        int | None,
        Query(
            ge=0, le=INT64_MAX, description="resume after this event id, for clients that cannot set headers"
        ),
    ] = None,
) -> int:
    # Seqs are 32-bit in the database (Postgres refuses a larger bound): an id past every one of them
    # resumes after all, as it would with no limit.
    return min(resume_point(last_event_id_header, last_event_id), INT32_MAX)


async def first_page(
    job_id: JobIdPath,
    after_seq: Annotated[int, Depends(resume_after)],
    hub: Annotated[JobLogHub, Depends(job_log_hub)],
    _: Reader,
) -> LogPage:
    """The first rows to send, read before the stream starts, so an unknown job is a 404 (afterwards a
    status can no longer change). Streams opening at the same point share one read."""
    page = await hub.read_after(job_id, after_seq)
    if page.state is None:
        raise JobNotFoundError(f"no reconfiguration {job_id!r}", job_id=job_id)
    return page


@router.get("/{job_id}/events", name="events", response_class=EventSourceResponse, responses=_SSE_RESPONSE)
async def stream_events(
    job_id: JobIdPath,
    after_seq: Annotated[int, Depends(resume_after)],
    page: Annotated[LogPage, Depends(first_page)],
    hub: Annotated[JobLogHub, Depends(job_log_hub)],
    _slot: Annotated[None, Depends(stream_slot)],
    principal: Reader,
    database: DatabaseDep,
    settings: SettingsDep,
) -> AsyncIterator[ServerSentEvent]:
    """Live progress of one job, resumable; the stream ends after the job's terminal transition (or
    with `event: revoked` once its token is revoked)."""

    async def still_live() -> bool:
        return await database.run(lambda session: tokens.is_live(session, token_id=principal.token_id))

    recheck_s = settings.events_token_recheck_s
    async for event in follow(hub, job_id, after_seq, page, still_live=still_live, recheck_s=recheck_s):
        yield event
