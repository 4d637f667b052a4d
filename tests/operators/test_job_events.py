"""`GET /v1/reconfigurations/{id}/events`: a job's log as Server-Sent Events, live and resumable.

The live tests run against a real uvicorn coordinator (an endless stream through an in-process ASGI
transport would hang); the job is moved with the state machine's own functions on the same database.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.jobs.models import JobEvent
from app.jobs.states import JobState
from app.jobs.transitions import append_event, transition
from tests.operators import sse
from tests.support.factories import make_job, static_deployment
from tests.support.processes import Coordinator

S = JobState
PROBLEM = "application/problem+json"


@pytest.fixture
def live(database_url: str, tmp_path: Path) -> Iterator[Coordinator]:
    env = {
        "EPCTL_EVENTS_POLL_S": "0.05",
        "EPCTL_AUTO_MIGRATE": "false",  # the schema is there
        "EPCTL_EVENTS_TOKEN_RECHECK_S": "0.2",
    }
    with Coordinator(database_url, tmp_path / "data", env=env) as running:
        yield running


@pytest.fixture
def job_id(session: Session) -> str:
    deployment = static_deployment(session, "d1", engines=3)
    return make_job(session, deployment, 3).id


def move(db_engine: Engine, job_id: str, before: JobState, after: JobState) -> None:
    with Session(db_engine) as session:
        transition(session, job_id=job_id, from_state=before, to_state=after, message=f"{before} -> {after}")


def progress(db_engine: Engine, job_id: str, step: str, percent: float) -> None:
    with Session(db_engine) as session:
        append_event(
            session,
            job_id=job_id,
            kind="progress",
            message=step,
            data={"step": step, "percent": percent},
            changes={"progress_step": step, "progress_percent": percent},
        )


def log_seqs(db_engine: Engine, job_id: str) -> list[int]:
    with Session(db_engine) as session:
        return list(
            session.exec(
                select(JobEvent.seq).where(JobEvent.job_id == job_id).order_by(col(JobEvent.seq))
            ).all()
        )


def open_stream(client: httpx.Client, job_id: str, **headers: str) -> httpx.Response:
    request = client.build_request(
        "GET", f"/v1/reconfigurations/{job_id}/events", headers=headers, timeout=httpx.Timeout(10.0)
    )
    return client.send(request, stream=True)


def test_stream_resumed_with_last_event_id_misses_nothing_and_repeats_nothing(
    live: Coordinator, db_engine: Engine, job_id: str
) -> None:
    received: list[sse.Event] = []
    with live.client() as client:
        first = open_stream(client, job_id)
        try:
            assert first.status_code == 200
            assert first.headers["content-type"].startswith("text/event-stream")
            stream = sse.events(first.iter_lines())
            received.append(next(stream))  # the log row the job was created with
            move(db_engine, job_id, S.pending, S.preparing)
            progress(db_engine, job_id, "standby groups built", 20.0)
            move(db_engine, job_id, S.preparing, S.syncing)
            while received[-1].data.get("to_state") != "syncing":
                received.append(next(stream))
        finally:
            first.close()  # the connection drops mid-job
        # While no one listens, the job moves on.
        progress(db_engine, job_id, "weights synced", 60.0)
        move(db_engine, job_id, S.syncing, S.committing)
        resumed = open_stream(client, job_id, **{"Last-Event-ID": received[-1].id or ""})
        try:
            stream = sse.events(resumed.iter_lines())
            received.append(next(stream))
            move(db_engine, job_id, S.committing, S.cleaning_up)
            move(db_engine, job_id, S.cleaning_up, S.succeeded)
            received.extend(stream)  # runs to the end: the server closes after the terminal event
        finally:
            resumed.close()
    *log_events, end = received
    seqs = [int(e.id or 0) for e in log_events]
    assert seqs == log_seqs(db_engine, job_id) == list(range(1, len(seqs) + 1))
    assert [e.data["seq"] for e in log_events] == seqs
    assert [e.data["to_state"] for e in log_events if e.event == "transition"] == [
        "preparing",
        "syncing",
        "committing",
        "cleaning_up",
        "succeeded",
    ]
    assert [e.data["message"] for e in log_events if e.event == "progress"] == [
        "standby groups built",
        "weights synced",
    ]
    assert (end.event, end.id, end.data["state"], end.data["last_event_id"]) == (
        "end",
        None,
        "succeeded",
        seqs[-1],
    )


def test_a_stream_ends_once_its_token_is_revoked(live: Coordinator, db_engine: Engine, job_id: str) -> None:
    """A revoked token opens no door, a stream it holds open included: the stream says `revoked` and
    closes (within the recheck interval), while the job goes on."""
    viewer = live.api.post("/v1/tokens", json={"name": "watcher", "role": "viewer"}).json()
    with live.client(viewer["token"]) as client:
        response = open_stream(client, job_id)
        try:
            assert response.status_code == 200
            stream = sse.events(response.iter_lines())
            assert next(stream).event == "created"  # the log row the job was created with
            assert live.api.delete(f"/v1/tokens/{viewer['id']}").status_code == 200
            rest = list(stream)  # the server closes the stream: this ends
        finally:
            response.close()
    assert [e.event for e in rest] == ["revoked"] and rest[0].data["code"] == "token-revoked"
    with live.client(viewer["token"]) as client:
        assert open_stream(client, job_id).status_code == 401


def test_query_parameter_resumes_like_the_header(live: Coordinator, db_engine: Engine, job_id: str) -> None:
    move(db_engine, job_id, S.pending, S.preparing)
    move(db_engine, job_id, S.preparing, S.rolled_back)
    all_seqs = log_seqs(db_engine, job_id)
    with live.client() as client:
        response = client.get(f"/v1/reconfigurations/{job_id}/events", params={"last_event_id": all_seqs[0]})
    received = list(sse.events(iter(response.text.splitlines())))
    assert [int(e.id) for e in received if e.id] == all_seqs[1:]
    assert received[-1].event == "end" and received[-1].data["state"] == "rolled_back"


# --- in-process: responses that end -----------------------------------------------------------------


def test_finished_job_streams_its_whole_log_then_ends(
    client: TestClient, db_engine: Engine, job_id: str
) -> None:
    move(db_engine, job_id, S.pending, S.cancelled)
    response = client.get(f"/v1/reconfigurations/{job_id}/events")
    received = list(sse.events(iter(response.text.splitlines())))
    assert [int(e.id) for e in received if e.id] == log_seqs(db_engine, job_id)
    assert received[0].retry is not None, "the first event tells EventSource how soon to reconnect"
    assert received[-1].event == "end"


def test_resume_after_the_last_event_of_a_finished_job_sends_only_end(
    client: TestClient, db_engine: Engine, job_id: str
) -> None:
    move(db_engine, job_id, S.pending, S.cancelled)
    last = log_seqs(db_engine, job_id)[-1]
    response = client.get(f"/v1/reconfigurations/{job_id}/events", headers={"Last-Event-ID": str(last)})
    assert [e.event for e in sse.events(iter(response.text.splitlines()))] == ["end"]


@pytest.mark.databases("sqlite", "postgres")
def test_resume_after_an_id_beyond_every_stored_one_sends_only_end(
    client: TestClient, db_engine: Engine, job_id: str
) -> None:
    """Any id up to 2^63-1 is valid, though seqs are 32-bit in the database (Postgres once refused the
    query with a 422 for a request that was valid)."""
    move(db_engine, job_id, S.pending, S.cancelled)
    path = f"/v1/reconfigurations/{job_id}/events"
    for response in (
        client.get(path, headers={"Last-Event-ID": str(2**63 - 1)}),
        client.get(path, params={"last_event_id": 2**31}),
    ):
        assert response.status_code == 200, response.text
        assert [e.event for e in sse.events(iter(response.text.splitlines()))] == ["end"]


def test_unknown_job_is_404_problem_before_any_stream(client: TestClient) -> None:
    response = client.get("/v1/reconfigurations/rcfg_nope/events")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith(PROBLEM)


def test_last_event_id_that_is_not_an_event_id_is_422(client: TestClient, job_id: str) -> None:
    response = client.get(f"/v1/reconfigurations/{job_id}/events", headers={"Last-Event-ID": "abc"})
    assert response.status_code == 422 and response.json()["code"] == "invalid-last-event-id"


def test_stream_needs_a_token(client: TestClient, job_id: str) -> None:
    response = TestClient(client.app).get(f"/v1/reconfigurations/{job_id}/events")
    assert response.status_code == 401
    assert response.headers["content-type"].startswith(PROBLEM)
