"""`GET /v1/reconfigurations/{id}/events`: a job's log as Server-Sent Events (FastAPI's own SSE support).

One event per log row (transitions and progress/phase/engine notes), in `seq` order: `id:` is the row's
`seq`, `event:` its kind, `data:` the row as JSON. A client that reconnects with `Last-Event-ID` (or
`?last_event_id=`) gets exactly the rows after that one. Once the job is terminal and every row up to
its terminal transition has been sent, one last `event: end` (no id, so a resume point is unchanged)
says so and the stream closes; a client should stop reconnecting when it sees it.

The stream polls the database (`events_poll_s`) with a short session per poll, so it holds no
connection or transaction between polls and works the same with several coordinators: the rows are
the source of truth, wherever the runner that writes them lives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Query
from fastapi.sse import EventSourceResponse, ServerSentEvent
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.api.deps import Reader, SessionDep, SettingsDep, get_db_engine
from app.core.errors import InvalidRequestError
from app.core.problems import problem_responses
from app.jobs import service
from app.jobs.models import JobEvent, JobEventPublic, ReconfigurationJob
from app.jobs.states import TERMINAL_STATES, JobState

router = APIRouter(
    prefix="/v1/reconfigurations", tags=["reconfigurations"], responses=problem_responses(401, 403, 404, 422)
)

END_EVENT = "end"
RETRY_MS = 1000  # tells EventSource how soon to reconnect after a drop
PAGE_SIZE = 500


def event_of(job_id: str, row: JobEvent) -> ServerSentEvent:
    """One log row as an SSE event: id = seq, event = kind, data = the row (with the job's id)."""
    data = {"job_id": job_id, **JobEventPublic.from_row(row).model_dump(mode="json")}
    return ServerSentEvent(id=str(row.seq), event=row.kind, data=data)


def end_event(job_id: str, state: str, last_seq: int) -> ServerSentEvent:
    return ServerSentEvent(
        event=END_EVENT, data={"job_id": job_id, "state": state, "last_event_id": last_seq}
    )


def resume_point(header_value: str | None, query_value: int | None) -> int:
    """The seq to resume after: the `Last-Event-ID` header wins over `?last_event_id=`; none means 0."""
    if header_value is not None and header_value.strip():
        text = header_value.strip()
        if not text.isdigit():
            raise InvalidRequestError(
                f"Last-Event-ID {text!r} is not an event id of this stream (a non-negative integer)",
                code="invalid-last-event-id",
            )
        return int(text)
    return query_value or 0


def read_after(engine: Engine, job_id: str, after_seq: int) -> tuple[str | None, list[JobEvent]]:
    """(the job's state, its rows after `after_seq`). The state is read first: if it is terminal, the
    rows read after it include the terminal transition."""
    with Session(engine, expire_on_commit=False) as session:
        job = session.get(ReconfigurationJob, job_id)
        if job is None:
            return None, []
        state = job.state
        rows = session.exec(
            select(JobEvent)
            .where(col(JobEvent.job_id) == job_id, col(JobEvent.seq) > after_seq)
            .order_by(col(JobEvent.seq))
            .limit(PAGE_SIZE)
        ).all()
        return state, list(rows)


async def follow(
    engine: Engine, job_id: str, after_seq: int, *, poll_s: float
) -> AsyncIterator[ServerSentEvent]:
    """The stream itself, independent of HTTP: rows after `after_seq` as they appear, then `end`."""
    first = True
    while True:
        state, rows = await anyio.to_thread.run_sync(read_after, engine, job_id, after_seq)
        if state is None:
            return
        for row in rows:
            event = event_of(job_id, row)
            if first:
                event.retry = RETRY_MS
                first = False
            yield event
            after_seq = row.seq
        if len(rows) == PAGE_SIZE:
            continue  # more rows are waiting: no pause, no end yet
        if JobState(state) in TERMINAL_STATES:
            yield end_event(job_id, state, after_seq)
            return
        await anyio.sleep(poll_s)


def existing_job(job_id: str, session: SessionDep, _: Reader) -> str:
    """404 before the stream starts (afterwards a status can no longer change). Closes the request's
    session: a stream may stay open for minutes and must not pin a connection or a transaction."""
    try:
        service.get_job(session, job_id=job_id)  # JobNotFoundError -> 404 problem+json
    finally:
        session.close()
    return job_id


_SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the job's log as Server-Sent Events; `id:` is the row's seq, `event:` its kind "
        "(`transition`, `progress`, ...), `data:` the row as JSON; a final `event: end` when the job is over",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


def resume_after(
    last_event_id_header: Annotated[
        str | None,
        Header(alias="Last-Event-ID", description="resume after this event id (EventSource sends it)"),
    ] = None,
    last_event_id: Annotated[
        int | None, Query(ge=0, description="resume after this event id, for clients that cannot set headers")
    ] = None,
) -> int:
    return resume_point(last_event_id_header, last_event_id)


@router.get("/{job_id}/events", name="events", response_class=EventSourceResponse, responses=_SSE_RESPONSE)
async def stream_events(
    job_id: Annotated[str, Depends(existing_job)],
    after_seq: Annotated[int, Depends(resume_after)],
    engine: Annotated[Engine, Depends(get_db_engine)],
    settings: SettingsDep,
) -> AsyncIterator[ServerSentEvent]:
    """Live progress of one job, resumable; the stream ends after the job's terminal transition."""
    async for event in follow(engine, job_id, after_seq, poll_s=settings.events_poll_s):
        yield event
