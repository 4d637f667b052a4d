"""The front door's request log (issue 35): HAProxy's per-request line parsed, the requests a commit
window held picked out, and the keeper's socket reading what is sent to it."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from app.frontdoor.haproxy import DoorConfig, render_config
from app.frontdoor.requestlog import LOG_FORMAT, Logged, RequestLog, held_in_window, parse

# A line as HAProxy 2.6 sends it (`log <socket> local0`, `LOG_FORMAT`), taken from a real run.
LINE = b"<134>Dec  7 02:02:31 haproxy[21947]: epctl 1796608951.538 58 0 52 ep_demo e1 200 0 ----\n"


def test_a_real_haproxy_line_is_parsed() -> None:
    assert parse(LINE) == Logged(1796608951.538, 58.0, 0.0, "ep_demo", "e1", 200, 0)


@pytest.mark.parametrize(
    "line",
    [
        b"<134>Dec  7 02:02:31 haproxy[1]: Proxy fd_demo started.",
        b"<134>Dec  7 02:02:31 haproxy[1]: epctl 1796608951.538 58",
        b"<134>Dec  7 02:02:31 haproxy[1]: epctl x 58 0 52 ep_demo e1 200 0 ----",
    ],
    ids=["another line", "cut short", "not a number"],
)
def test_other_lines_are_skipped(line: bytes) -> None:
    assert parse(line) is None


def logged(accepted_at: float, total_ms: float, status: int = 200, backend: str = "ep_demo") -> Logged:
    return Logged(accepted_at, total_ms, 0.0, backend, "e1", status, 0)


WINDOW = (100.0, 100.020)  # 20 ms
HELD = [
    # (what, request, held by the window)
    ("answered before the window opened", logged(99.9, 50.0), False),
    ("in flight when it opened", logged(99.99, 40.0), True),
    ("arrived inside it", logged(100.005, 30.0), True),
    ("arrived as it closed", logged(100.020, 5.0), True),
    ("arrived after it", logged(100.021, 5.0), False),
    ("another deployment's", logged(100.005, 30.0, backend="ep_other"), False),
]


@pytest.mark.parametrize(("what", "sent", "held"), HELD, ids=[c[0] for c in HELD])
def test_a_request_is_held_when_it_was_in_flight_while_the_window_was_open(
    what: str, sent: Logged, held: bool
) -> None:
    counted = held_in_window([sent], "ep_demo", *WINDOW)
    assert counted is not None and counted["count"] == int(held), what


def test_the_window_counts_held_requests_their_longest_wait_and_failures() -> None:
    requests = [logged(99.99, 40.0), logged(100.005, 300.0, 503), logged(99.0, 1.0)]
    assert held_in_window(requests, "ep_demo", *WINDOW) == {"count": 2, "longest_wait_ms": 300.0, "failed": 1}
    assert held_in_window(requests, "ep_demo", None, None) is None  # no window: nothing held


def test_the_config_logs_each_request_to_the_keepers_socket_only_when_asked() -> None:
    door = DoorConfig("demo", "127.0.0.1", 8001)
    plain = render_config("/run/admin.sock", [door])
    logging = render_config("/run/admin.sock", [door], request_log="/run/requests.sock")
    assert "log " not in plain
    assert "    log /run/requests.sock len 1024 local0 info" in logging
    assert f'    log-format "{LOG_FORMAT}"' in logging and "    log global" in logging


def test_the_keepers_socket_keeps_what_is_sent_to_it(tmp_path: Path) -> None:
    async def exchange() -> list[Logged]:
        requests = RequestLog(str(tmp_path / "requests.sock"))
        requests.open()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
                sender.sendto(b"<134>x haproxy[1]: Proxy started.", requests.path)
                sender.sendto(LINE, requests.path)
            for _ in range(100):
                if requests.recent:
                    break
                await asyncio.sleep(0.01)
            return list(requests.recent)
        finally:
            requests.close()

    assert asyncio.run(exchange()) == [parse(LINE)]
    assert not (tmp_path / "requests.sock").exists()
