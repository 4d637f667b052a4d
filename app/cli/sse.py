"""Reading a `text/event-stream` body: the job event stream `epctl` follows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


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
