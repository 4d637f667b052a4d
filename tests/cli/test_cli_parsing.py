"""The CLI's pure helpers: the SSE parser its live progress reads, and the --since/--until ages."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import typer

from app.cli import watch
from app.cli.client import Coordinator
from app.cli.jobs import parse_when
from app.cli.sse import iter_sse


def test_sse_parser_yields_one_event_per_blank_line_with_its_id_and_type() -> None:
    body = [
        "id: 3",
        "event: transition",
        'data: {"to_state": "syncing"}',
        "",
        "id: 4",
        "data: a",
        "data: b",
        "",
    ]
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


def test_iso_time_without_zone_is_taken_as_utc_like_every_time_epctl_prints() -> None:
    utc = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    assert datetime.fromisoformat(parse_when("2026-11-29T12:00") or "") == utc
    assert datetime.fromisoformat(parse_when("2026-11-29 12:00:00 UTC") or "") == utc  # pasted back
    assert datetime.fromisoformat(parse_when("2026-11-29T13:00+01:00") or "") == utc


def test_unreadable_time_is_a_usage_error() -> None:
    with pytest.raises(typer.BadParameter):
        parse_when("yesterday-ish")


class NoStreamCoordinator(Coordinator):
    """A coordinator without an event stream (404 on `/events`), whose job moves on at each GET."""

    def __init__(self, states: list[str]) -> None:
        super().__init__(url="http://coordinator.test", token=None)
        self.states = iter(states)
        self.seen: list[str] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        state = next(self.states, "succeeded")
        self.seen.append(state)
        return {"id": "rcfg_1", "state": state, "progress": {"percent": 0}}

    @contextmanager
    def stream(self, path: str, *, headers: Mapping[str, str], read_timeout_s: float) -> Iterator[Any]:
        yield SimpleNamespace(status=404, is_error=True, read=lambda: None)


def test_watch_falls_back_to_polling_when_the_coordinator_has_no_event_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = NoStreamCoordinator(["pending", "preparing", "syncing", "succeeded"])
    monkeypatch.setattr(watch, "POLL_INTERVAL_S", 0.0)
    job = watch.follow(api, "rcfg_1", live=False)
    assert job["state"] == "succeeded"
    assert api.seen[-1] == "succeeded" and "syncing" in api.seen
