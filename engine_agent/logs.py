"""Log lines for both processes (coordinator and agent): `text` for people, `json` for log pipelines.

`EPCTL_LOG_FORMAT=json` (or `epctl-agent --log-format json`) makes every line one JSON object:
`time` (ISO 8601, UTC), `level`, `logger`, `message`, and `job_id`, `engine_id`, `deployment` when
known (plus `exception` with the traceback). `text` (the default) writes
`<time> <LEVEL> <logger>: <message> [job_id=... engine_id=...]`.

Where the ids come from, most specific first:
- `log.warning("...", extra=log_fields(job_id=...))` on one call;
- `with log_context(job_id=..., deployment=...):` for everything logged inside, including the asyncio
  tasks started inside (they copy the context); a thread starts with an empty context, so a worker
  thread enters its own `log_context`;
- `set_process_fields(engine_id=...)` for the whole process (an agent is one engine).

Torch-free and app-free: the coordinator imports it as it imports the protocol.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, TextIO, get_args

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
FIELDS = ("job_id", "engine_id", "deployment")
HANDLER_NAME = "epctl"
# Libraries that give their loggers handlers of their own (propagate=False): those get our formatter
# too (uvicorn when it configures its logging itself; NIXL's once imported).
FOREIGN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "nixl")
# One INFO line per HTTP call would drown everything else (the coordinator calls its agents often);
# Alembic says which dialect it uses at every start.
QUIET_LOGGERS = ("httpx", "httpcore", "alembic")

# Access-log lines of calls that answer every few seconds per engine, kept out of the log when they
# succeed: at 2,048 engines a coordinator answers ~700 heartbeats a second (issue 37). Failures stay.
ROUTINE_CALLS = (
    ("POST", re.compile(r"/v1/engines/[^/?]+/heartbeat")),
    ("GET", re.compile(r"/(healthz|readyz|livez)")),
)


def is_routine_access(method: str, path: str, status: int) -> bool:
    """Whether an access-log line is a routine call that succeeded (dropped) rather than news (kept)."""
    if status >= 400:
        return False
    bare = path.split("?", 1)[0]
    return any(method == m and pattern.fullmatch(bare) for m, pattern in ROUTINE_CALLS)


class RoutineAccessFilter(logging.Filter):
    """Drops uvicorn's access-log records of routine calls that succeeded (`is_routine_access`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:  # uvicorn's (client, method, path, http, status)
            return True
        _, method, path, _, status = args
        if not isinstance(status, int):
            return True
        return not is_routine_access(str(method), str(path), status)


_context: ContextVar[dict[str, str]] = ContextVar("epctl_log_context", default={})  # noqa: B039 (never mutated)
_process_fields: dict[str, str] = {}


def log_fields(**fields: str | None) -> dict[str, str]:
    """`extra=` for one log call: the known ids that are set."""
    return {name: value for name, value in fields.items() if name in FIELDS and value is not None}


@contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Every record logged inside (this task, and the tasks it starts) carries these ids."""
    token = _context.set({**_context.get(), **log_fields(**fields)})
    try:
        yield
    finally:
        _context.reset(token)


def set_process_fields(**fields: str | None) -> None:
    """Ids true of every record this process writes (an agent's engine_id and deployment)."""
    _process_fields.update(log_fields(**fields))


def current_fields(record: logging.LogRecord | None = None) -> dict[str, str]:
    """The ids of a record: its own `extra`, else the context's, else the process's."""
    merged = {**_process_fields, **_context.get()}
    if record is not None:
        merged.update({name: getattr(record, name) for name in FIELDS if getattr(record, name, None)})
    return {name: merged[name] for name in FIELDS if name in merged}


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **current_fields(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """`<time> <LEVEL> <logger>: <message> [job_id=...]`, then the traceback if any."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        fields = current_fields(record)
        if fields:
            text += " [" + " ".join(f"{name}={value}" for name, value in fields.items()) + "]"
        return text


def formatter(log_format: LogFormat) -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure_logging(
    log_format: LogFormat, level: int | str = logging.INFO, stream: TextIO | None = None
) -> None:
    """Route the process's logs through one stderr handler in `log_format` (and format the handlers of
    FOREIGN_LOGGERS alike).
    Idempotent: calling it again replaces the handler it installed (and nothing else)."""
    chosen = formatter(log_format)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(chosen)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in FOREIGN_LOGGERS:
        for own in logging.getLogger(name).handlers:
            own.setFormatter(chosen)
    access = logging.getLogger("uvicorn.access")
    for old_filter in [f for f in access.filters if isinstance(f, RoutineAccessFilter)]:
        access.removeFilter(old_filter)
    access.addFilter(RoutineAccessFilter())
