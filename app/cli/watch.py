"""Following a reconfiguration to its end: live progress from the SSE stream (polling as a fallback).

Each event is only a trigger: the display is drawn from a fresh `GET` of the job, so it shows the same
fields as `epctl jobs show` whatever an event's payload carries. What is shown: `app.cli.progress_view`
while the job runs, `app.cli.job_summary` once it has ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from app.cli.client import Coordinator, CoordinatorUnreachable
from app.cli.http import StreamInterrupted, TransportError
from app.cli.progress_view import ProgressView
from app.cli.sse import iter_sse

TERMINAL_STATES = frozenset({"succeeded", "rolled_back", "failed", "cancelled"})
POLL_INTERVAL_S = 0.5
END_EVENT = "end"  # the server's last event once the job is terminal (no id)
# The stream may be quiet for long stretches (a slow prepare); reconnecting is cheap and resumes exactly.
STREAM_READ_TIMEOUT_S = 15.0


class WatchTimeout(Exception):
    pass


def job_path(job_id: str) -> str:
    return f"/v1/reconfigurations/{job_id}"


def is_terminal(job: dict[str, Any]) -> bool:
    return job.get("state") in TERMINAL_STATES


def follow(api: Coordinator, job_id: str, *, live: bool, timeout_s: float | None = None) -> dict[str, Any]:
    """Block until the job is terminal; show progress when `live`; return the final job."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    view = ProgressView(live=live)
    job = api.get(job_path(job_id))
    view.update(job)
    try:
        if not is_terminal(job):
            job = _follow_stream(api, job_id, view, deadline) or _follow_polling(api, job_id, view, deadline)
    finally:
        view.close()
    return job


def _check_deadline(deadline: float | None, job_id: str) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise WatchTimeout(f"job {job_id} did not finish in time")


def _follow_stream(
    api: Coordinator, job_id: str, view: ProgressView, deadline: float | None
) -> dict[str, Any] | None:
    """Follow through the SSE endpoint, resuming with Last-Event-ID after a drop. None: no stream here."""
    last_event_id: str | None = None
    failures = 0
    while True:
        _check_deadline(deadline, job_id)
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        read_timeout = STREAM_READ_TIMEOUT_S
        if deadline is not None:
            read_timeout = max(0.05, min(read_timeout, deadline - time.monotonic()))
        try:
            with api.stream(
                f"{job_path(job_id)}/events", headers=headers, read_timeout_s=read_timeout
            ) as response:
                if response.status in (404, 405, 501):
                    # No stream on this coordinator (a missing job is reported by this GET instead).
                    response.read()
                    api.get(job_path(job_id))
                    return None
                if response.is_error:
                    Coordinator.decode(response.read())
                failures = 0
                lines = _lines_until(response.iter_lines(), deadline, job_id, view.tick)
                for event in iter_sse(lines):
                    if event.id:
                        last_event_id = event.id
                    if event.event == END_EVENT:
                        break
                    job = api.get(job_path(job_id))
                    view.update(job)
                    if is_terminal(job):
                        return job
                    _check_deadline(deadline, job_id)
        except StreamInterrupted:  # quiet past the read timeout, or dropped: reconnect and resume
            failures += 1
        except TransportError as exc:
            failures += 1
            if failures >= 5:
                raise CoordinatorUnreachable(f"lost the coordinator at {api.url}: {exc}") from exc
            time.sleep(min(2.0, 0.2 * failures))
        # The stream ended (the server closes it at the terminal event) or dropped: settle with a GET.
        job = api.get(job_path(job_id))
        view.update(job)
        if is_terminal(job):
            return job


def _lines_until(
    lines: Iterator[str], deadline: float | None, job_id: str, tick: Callable[[], None] = lambda: None
) -> Iterator[str]:
    """The stream's lines, checking the deadline at each one (keep-alive comments included), and
    letting the view say "still" when a step holds."""
    for line in lines:
        _check_deadline(deadline, job_id)
        tick()
        yield line


def _follow_polling(
    api: Coordinator, job_id: str, view: ProgressView, deadline: float | None
) -> dict[str, Any]:
    view.note("event stream unavailable: polling")
    while True:
        job = api.get(job_path(job_id))
        view.update(job)
        if is_terminal(job):
            return job
        _check_deadline(deadline, job_id)
        time.sleep(POLL_INTERVAL_S)
