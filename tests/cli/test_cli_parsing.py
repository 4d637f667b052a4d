"""The CLI's pure helpers: the SSE parser its live progress reads, and the --since/--until ages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import typer

from app.cli.jobs import parse_when
from app.cli.watch import iter_sse


def test_sse_parser_yields_one_event_per_blank_line_with_its_id_and_type() -> None:
    body = ["id: 3", "event: transition", 'data: {"to_state": "syncing"}', "",
            "id: 4", "data: a", "data: b", ""]
    events = list(iter_sse(iter(body)))
    assert [(e.id, e.event, e.data) for e in events] == [
        ("3", "transition", '{"to_state": "syncing"}'),
        ("4", "message", "a\nb"),
    ]


def test_sse_parser_skips_comments_and_keepalives() -> None:
    body = [": keep-alive", "", "id: 7", "data: x", "", ":ping", ""]
    assert [(e.id, e.data) for e in iter_sse(iter(body))] == [("7", "x")]


def test_age_means_that_long_before_now_in_utc() -> None:
    parsed = datetime.fromisoformat(parse_when("2h") or "")
    assert abs((datetime.now(UTC) - timedelta(hours=2) - parsed).total_seconds()) < 5


def test_iso_time_without_zone_is_taken_as_local_time() -> None:
    local = datetime(2026, 11, 29, 12, 0).astimezone()
    assert datetime.fromisoformat(parse_when("2026-11-29T12:00") or "") == local


def test_unreadable_time_is_a_usage_error() -> None:
    with pytest.raises(typer.BadParameter):
        parse_when("yesterday-ish")
