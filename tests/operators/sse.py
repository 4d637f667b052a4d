"""A small Server-Sent Events reader over an httpx line stream (what a client library would do)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Event:
    id: str | None
    event: str | None
    data: Any
    retry: int | None = None


def events(lines: Iterator[str]) -> Iterator[Event]:
    """Parse `text/event-stream` lines into events; comments (keep-alive pings) are skipped."""
    event_id: str | None = None
    name: str | None = None
    retry: int | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data or name:
                yield Event(event_id, name, json.loads("\n".join(data)) if data else None, retry)
            event_id, name, retry, data = None, None, None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            event_id = value
        elif field == "event":
            name = value
        elif field == "data":
            data.append(value)
        elif field == "retry":
            retry = int(value)
