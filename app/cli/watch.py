"""Following a reconfiguration to its end: live progress from the SSE stream (polling as a fallback),
then a summary of what happened (state, downtime, phase durations, per-engine pauses, error, cleanup).

Each event is only a trigger: the display is drawn from a fresh `GET` of the job, so it shows the same
fields as `epctl jobs show` whatever an event's payload carries.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from app.cli.client import (
    Coordinator,
    CoordinatorError,
    CoordinatorUnreachable,
    duration_ms,
    fmt_ms,
    parse_time,
    short_time,
    stdout,
    styled_state,
    table,
)

TERMINAL_STATES = frozenset({"succeeded", "rolled_back", "failed", "cancelled"})
PHASE_ORDER = ("preparing", "syncing", "committing", "cleaning_up")
POLL_INTERVAL_S = 0.5
END_EVENT = "end"  # the server's last event once the job is terminal (no id)
# The stream may be quiet for long stretches (a slow prepare); reconnecting is cheap and resumes exactly.
STREAM_READ_TIMEOUT_S = 15.0


class WatchTimeout(Exception):
    pass


@dataclass
class SseEvent:
    id: str | None
    event: str
    data: str


def iter_sse(lines: Iterator[str]) -> Iterator[SseEvent]:
    """Parse a text/event-stream body (WHATWG rules: blank line ends an event, ':' starts a comment)."""
    event_id: str | None = None
    event_type = "message"
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r")
        if line == "":
            if data or event_id is not None:
                yield SseEvent(event_id, event_type, "\n".join(data))
            event_id, event_type, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            event_id = value
        elif field == "event":
            event_type = value
        elif field == "data":
            data.append(value)
    if data:
        yield SseEvent(event_id, event_type, "\n".join(data))


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
        timeout = httpx.Timeout(api.timeout_s, read=read_timeout)
        try:
            with api.http.stream("GET", f"{job_path(job_id)}/events", headers=headers,
                                 timeout=timeout) as response:
                if response.status_code in (404, 405, 501):
                    # No stream on this coordinator (a missing job is reported by this GET instead).
                    response.read()
                    api.get(job_path(job_id))
                    return None
                if response.is_error:
                    response.read()
                    Coordinator.decode(response)
                failures = 0
                for event in iter_sse(_lines_until(response.iter_lines(), deadline, job_id)):
                    if event.id:
                        last_event_id = event.id
                    if event.event == END_EVENT:
                        break
                    job = api.get(job_path(job_id))
                    view.update(job)
                    if is_terminal(job):
                        return job
                    _check_deadline(deadline, job_id)
        except (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError):
            failures += 1
        except httpx.TransportError as exc:
            failures += 1
            if failures >= 5:
                raise CoordinatorUnreachable(f"lost the coordinator at {api.url}: {exc}") from exc
            time.sleep(min(2.0, 0.2 * failures))
        # The stream ended (the server closes it at the terminal event) or dropped: settle with a GET.
        job = api.get(job_path(job_id))
        view.update(job)
        if is_terminal(job):
            return job


def _lines_until(lines: Iterator[str], deadline: float | None, job_id: str) -> Iterator[str]:
    """The stream's lines, checking the deadline at each one (keep-alive comments included)."""
    for line in lines:
        _check_deadline(deadline, job_id)
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


# --- live display ---------------------------------------------------------------------------------------


def progress_of(job: dict[str, Any]) -> tuple[float, str | None]:
    progress = job.get("progress") or {}
    if isinstance(progress, dict):
        return float(progress.get("percent") or 0.0), progress.get("step")
    return float(job.get("progress_percent") or 0.0), job.get("progress_step")


class ProgressView:
    """A rich live panel on a terminal; one plain line per change otherwise (logs, pipes, tests)."""

    def __init__(self, *, live: bool) -> None:
        self.enabled = live
        self.interactive = live and stdout.is_terminal
        self.live: Live | None = None
        self.last_line: str | None = None
        self.job: dict[str, Any] | None = None

    def update(self, job: dict[str, Any]) -> None:
        self.job = job
        if not self.enabled:
            return
        if self.interactive:
            if self.live is None:
                self.live = Live(self.render(job), console=stdout, refresh_per_second=8, transient=True)
                self.live.start()
            else:
                self.live.update(self.render(job))
            return
        percent, step = progress_of(job)
        line = f"{job.get('state')} {percent:5.1f}%" + (f"  {step}" if step else "")
        if line != self.last_line:
            stdout.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {line}")
            self.last_line = line

    def note(self, message: str) -> None:
        if self.enabled:
            stdout.print(f"[dim]{message}[/]")

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    @staticmethod
    def render(job: dict[str, Any]) -> RenderableType:
        percent, step = progress_of(job)
        head = Text.from_markup(
            f"[bold]{job.get('deployment')}[/] {job.get('from_dp_size')} -> {job.get('to_dp_size')}  "
            f"{styled_state(job.get('state'))}  [dim]{job.get('id')}[/]"
        )
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=100, completed=percent, width=40), Text(f"{percent:3.0f}%"),
                    Text(step or "", style="dim"))
        phases = job.get("phases") or {}
        chips = []
        for name in PHASE_ORDER:
            times = phases.get(name)
            if times is None:
                chips.append(f"[dim]{name}[/]")
            elif times.get("ended_at"):
                took = fmt_ms(duration_ms(times.get("started_at"), times.get("ended_at")))
                chips.append(f"[green]{name}[/] [dim]{took}[/]")
            else:
                chips.append(f"[bold cyan]{name}...[/]")
        return Group(head, bar, Text.from_markup("  ".join(chips)))


# --- summary --------------------------------------------------------------------------------------------


def engine_rows(job: dict[str, Any]) -> list[list[Any]]:
    """One row per engine: id, role, ranks, generation, pause (ms), paused..resumed."""
    per_engine_ms = ((job.get("downtime") or {}).get("per_engine_ms")) or {}
    rows = []
    seen = set()
    for result in job.get("engine_results") or []:
        if not isinstance(result, dict):
            continue
        engine_id = result.get("engine_id")
        seen.add(engine_id)
        pause = result.get("pause") or {}
        pause_ms = pause.get("pause_ms") if isinstance(pause, dict) else None
        if pause_ms is None:
            pause_ms = per_engine_ms.get(engine_id)
        ranks = result.get("ranks")
        if "old_rank" in result or "new_rank" in result:
            ranks = [result.get("old_rank"), result.get("new_rank")]
        if isinstance(ranks, list | tuple):
            ranks = " -> ".join("-" if r is None else str(r) for r in ranks)
        elif isinstance(ranks, dict):
            ranks = " -> ".join("-" if r is None else str(r) for r in ranks.values())
        rows.append([engine_id, result.get("role"), ranks, result.get("generation"), fmt_ms(pause_ms),
                     _pause_window(pause)])
    for engine_id, pause_ms in per_engine_ms.items():
        if engine_id not in seen:
            rows.append([engine_id, None, None, None, fmt_ms(pause_ms), None])
    return rows


def _pause_window(pause: Any) -> str | None:
    if not isinstance(pause, dict) or pause.get("paused_at") is None:
        return None
    start = _clock(pause.get("paused_at"))
    end = _clock(pause.get("resumed_at")) if pause.get("resumed_at") is not None else "still paused"
    return f"{start} .. {end}"


def _clock(value: Any) -> str:
    if isinstance(value, int | float):
        return time.strftime("%H:%M:%S", time.localtime(value)) + f".{int((value % 1) * 1000):03d}"
    parsed = parse_time(str(value))
    return parsed.astimezone().strftime("%H:%M:%S.%f")[:-3] if parsed else str(value)


def print_summary(job: dict[str, Any]) -> None:
    state = job.get("state")
    stdout.print(
        f"Job [bold]{job.get('id')}[/] {styled_state(state)}  "
        f"{job.get('deployment')}: DP {job.get('from_dp_size')} -> {job.get('to_dp_size')}, "
        f"generation {job.get('from_generation')} -> {job.get('to_generation')}"
    )
    details = [
        ("requested by", job.get("requested_by")),
        ("reason", job.get("reason")),
        ("warm-up", job.get("warmup_policy") or job.get("warmup_policy_requested")),
        ("strategy", job.get("strategy")),
        ("created", short_time(job.get("created_at"))),
        ("took", fmt_ms(duration_ms(job.get("created_at"), job.get("finished_at")))),
    ]
    stdout.print("  ".join(f"[dim]{k}:[/] {v}" for k, v in details if v not in (None, "")))
    downtime = job.get("downtime_ms")
    stdout.print(f"[bold]downtime:[/] {fmt_ms(downtime) if downtime is not None else '-'}")
    phases = job.get("phases") or {}
    if phases:
        ordered = sorted(phases.items(), key=lambda kv: PHASE_ORDER.index(kv[0])
                         if kv[0] in PHASE_ORDER else len(PHASE_ORDER))
        rows = [[name, short_time(t.get("started_at")), fmt_ms(duration_ms(t.get("started_at"),
                t.get("ended_at"))) if t.get("ended_at") else "running"] for name, t in ordered]
        stdout.print(table("phases", ["PHASE", "STARTED", "DURATION"], rows))
    engines = engine_rows(job)
    if engines:
        stdout.print(table("engines", ["ENGINE", "ROLE", "RANKS", "GEN", "PAUSE", "PAUSED"], engines))
    print_failure(job)


def print_failure(job: dict[str, Any]) -> None:
    error = job.get("error")
    if error:
        where = ", ".join(f"{k} {error[k]}" for k in ("phase", "engine_id") if error.get(k))
        stdout.print(f"[bold red]error[/] ({error.get('type')}{'; ' + where if where else ''}): "
                     f"{error.get('message')}")
    cleanup_state = job.get("cleanup_state")
    if cleanup_state and cleanup_state not in ("none", "succeeded"):
        style = "red" if cleanup_state == "failed" else "yellow"
        stdout.print(f"[bold {style}]cleanup {cleanup_state}[/]: {describe_cleanup(job)}")
        if cleanup_state == "failed":
            stdout.print(f"  the next job of {job.get('deployment')} is refused until "
                         f"`epctl cleanup retry {job.get('id')}` or `epctl cleanup ack {job.get('id')}`")


def describe_cleanup(job: dict[str, Any]) -> str:
    """One line about the background destruction of the retired generation."""
    cleanup = job.get("cleanup") or {}
    if not isinstance(cleanup, dict):
        return str(cleanup)
    generation = cleanup.get("failed_generation") or cleanup.get("retired_generation")
    what = f"generation {generation}" if generation is not None else "retired groups"
    if job.get("cleanup_state") == "failed":
        return f"destroying {what} failed on {cleanup.get('failed_engine_id')}: {cleanup.get('error')}"
    engines = cleanup.get("engines") or []
    on = f" on {len(engines)} engines" if engines else ""
    if job.get("cleanup_state") in ("pending", "running"):
        return f"destroying {what}{on} in the background"
    return f"{what}{on}"


def describe_failure(job: dict[str, Any]) -> str:
    error = job.get("error") or {}
    message = error.get("message") or "no error recorded"
    where = " ".join(f"{k}={error[k]}" for k in ("phase", "engine_id", "type") if error.get(k))
    return f"job {job.get('id')} ended {job.get('state')}: {message}" + (f" ({where})" if where else "")


__all__ = [
    "CoordinatorError",
    "WatchTimeout",
    "describe_failure",
    "follow",
    "is_terminal",
    "print_summary",
]
