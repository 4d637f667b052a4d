"""A job's requests at the front door by sender: HAProxy's stick table read (`parse_table`) and the
growth between the job's two reads (`by_sender`), with the span it counts."""

from __future__ import annotations

from typing import Any

import pytest

from app.frontdoor.haproxy import DoorConfig, parse_table, render_config
from app.frontdoor.keeper import by_sender
from app.probe.canary import CANARY_HEADER

SHOWN = """# table: fd_demo, type: string, size:2, used:2
0x7f1d80036d38: key=canary use=0 exp=0 http_req_cnt=7 http_fail_cnt=1
0x557aae8ec5e8: key=client use=1 exp=0 shard=0 http_req_cnt=40 http_fail_cnt=0

"""


def test_the_table_is_read_by_sender_with_its_counters_only() -> None:
    assert parse_table(SHOWN) == {
        "canary": {"http_req_cnt": 7, "http_fail_cnt": 1},
        "client": {"http_req_cnt": 40, "http_fail_cnt": 0},
    }
    assert parse_table("# table: fd_demo, type: string, size:2, used:0\n\n") == {}


def test_the_frontend_counts_canaries_by_their_header_and_every_other_request_as_a_clients() -> None:
    config = render_config("/run/admin.sock", [DoorConfig("demo", "*", 8001)])
    frontend = config.split("frontend fd_demo\n", 1)[1].split("\n\n", 1)[0]
    assert "stick-table type string len 8 size 2 store http_req_cnt,http_fail_cnt" in frontend
    assert f"track-sc0 str(canary) if {{ req.hdr({CANARY_HEADER}) -m found }}" in frontend
    assert f"track-sc0 str(client) unless {{ req.hdr({CANARY_HEADER}) -m found }}" in frontend


def read(at: float, client: int | None, canary: int | None, failed: int = 0) -> dict[str, Any]:
    senders = {}
    if client is not None:
        senders["client"] = {"http_req_cnt": client, "http_fail_cnt": failed}
    if canary is not None:
        senders["canary"] = {"http_req_cnt": canary, "http_fail_cnt": 0}
    return {"read_at": [at, at + 0.001], "senders": senders}


CASES = [
    # (what, start, end, expected clients (requests, failed), canaries' requests)
    ("both grew", read(10.0, 100, 20), read(12.0, 150, 31, failed=2), (50, 2), 11),
    ("no client before the job", read(10.0, None, 5), read(12.0, 30, 9), (30, 0), 4),
    ("no request at all", read(10.0, None, None), read(12.0, None, None), (0, 0), 0),
    ("a HAProxy restarted in between (counters from 0)", read(10.0, 100, 20), read(12.0, 3, 1), (0, 0), 0),
]


@pytest.mark.parametrize(("what", "start", "end", "clients", "canaries"), CASES, ids=[c[0] for c in CASES])
def test_a_jobs_requests_by_sender_are_the_growth_between_its_reads(
    what: str, start: dict[str, Any], end: dict[str, Any], clients: tuple[int, int], canaries: int
) -> None:
    counted = by_sender(start, end)
    assert counted is not None
    assert (counted["clients"]["requests"], counted["clients"]["failed"]) == clients, what
    assert counted["canaries"]["requests"] == canaries, what
    assert counted["counted_from"] == [10.0, 10.001] and counted["counted_until"] == [12.0, 12.001]


def test_without_either_read_nothing_is_said() -> None:
    assert by_sender(None, read(12.0, 1, 1)) is None
    assert by_sender(read(10.0, 1, 1), None) is None
