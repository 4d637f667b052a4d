"""Starting a local HAProxy as a front door: a second start adopts the running one (a crashed
`epctl up`'s front door keeps serving), and the adopter stops it by its recorded pid; `epctl down`'s
helper stops one left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.frontdoor.haproxy import DoorConfig
from app.frontdoor.launch import answers, start_front_door, stop_recorded_front_door
from tests.frontdoor.conftest import require_haproxy
from tests.support.processes import free_port

pytestmark = pytest.mark.processes  # a real HAProxy


def test_a_second_start_adopts_the_running_front_door_and_stops_it(tmp_path: Path) -> None:
    require_haproxy()
    door = DoorConfig("fd", "127.0.0.1", free_port(), slots=2)
    first = start_front_door(tmp_path / "front-door", door)
    assert first.process is not None
    try:
        second = start_front_door(tmp_path / "front-door", door)
        assert second.adopted and second.adopted_pid == first.process.pid
        second.stop()
        assert first.process.wait(timeout=10) is not None and not answers(first.socket_path)
    finally:
        first.stop()


def test_epctl_downs_helper_stops_a_front_door_left_behind(tmp_path: Path) -> None:
    require_haproxy()
    left = start_front_door(tmp_path / "front-door", DoorConfig("fd", "127.0.0.1", free_port(), slots=2))
    assert left.process is not None
    try:
        assert stop_recorded_front_door(tmp_path / "front-door") == left.process.pid
        assert left.process.wait(timeout=10) is not None
        assert stop_recorded_front_door(tmp_path / "front-door") is None
    finally:
        left.stop()
