"""While no engine is ready (a broken group re-forming after a kill), requests wait at the front door and
are answered once one is ready again, rather than meet HAProxy's immediate "no server available" 503
(`app.frontdoor.haproxy`: the `hold` backup server). Real HAProxy."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine

from app.core.config import Settings
from app.frontdoor.haproxy import DoorConfig, RuntimeApi, backend_name
from app.frontdoor.launch import RunningDoor, start_front_door
from tests.frontdoor.conftest import NamedServer, require_haproxy
from tests.frontdoor.test_haproxy_keeper import _app, _applied, _deployment, _set_engine
from tests.support.fixtures import ADMIN_HEADERS
from tests.support.processes import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes  # a real HAProxy

CLIENTS = 6


class Burst:
    """`CLIENTS` requests sent at once to the front door, each on its own connection; their answers."""

    def __init__(self, door: RunningDoor) -> None:
        self.answers: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._send, args=(door.url,)) for _ in range(CLIENTS)]
        for thread in self.threads:
            thread.start()

    def _send(self, url: str) -> None:
        try:
            answer = httpx.post(f"{url}/v1/infer", content=b"x", timeout=30)
            text = answer.text if answer.status_code == 200 else str(answer.status_code)
        except httpx.HTTPError as exc:
            text = type(exc).__name__
        with self.lock:
            self.answers.append(text)

    def settled_or_waiting(self, door: RunningDoor, deployment: str) -> bool:
        """Each request answered, or waiting at the front door (in its queue, or on the `hold` slot)."""
        backend = backend_name(deployment)
        counters = asyncio.run(RuntimeApi(door.socket_path).counters(backend))
        waiting = counters.get("BACKEND", {}).get("qcur", 0) + counters.get("hold", {}).get("scur", 0)
        with self.lock:
            return len(self.answers) + waiting >= CLIENTS

    def join(self) -> Counter[str]:
        for thread in self.threads:
            thread.join(60)
        return Counter(self.answers)


def _run(command: str, door: RunningDoor) -> None:
    asyncio.run(RuntimeApi(door.socket_path).run([command]))


def _outage(door: RunningDoor, deployment: str, server: NamedServer) -> Counter[str]:
    """The only engine taken out, a burst sent, the engine put back once the burst is answered or
    waiting: what the burst was answered."""
    backend = backend_name(deployment)
    _run(f"set server {backend}/e1 state maint", door)
    burst = Burst(door)
    wait_until(
        lambda: burst.settled_or_waiting(door, deployment), timeout_s=30, what="the burst answered or waiting"
    )
    _run(f"set server {backend}/e1 state ready", door)
    return burst.join()


def _door(
    tmp_path: Path, name: str, server: NamedServer, *, hold: bool, queue_timeout_s: int = 10
) -> RunningDoor:
    door = start_front_door(
        tmp_path / name,
        DoorConfig(name, "127.0.0.1", free_port(), slots=2),
        hold=hold,
        queue_timeout_s=queue_timeout_s,
    )
    host, port = server.url.removeprefix("http://").split(":")
    _run(f"set server {backend_name(name)}/e1 addr {host} port {port}", door)
    _run(f"set server {backend_name(name)}/e1 state ready", door)
    return door


def test_requests_wait_while_no_engine_is_ready_where_plain_haproxy_fails_them(
    tmp_path: Path, named_servers: list[NamedServer]
) -> None:
    """The same outage in front of the same engine, through HAProxy without the `hold` (before) and with
    it (after): before, every request sent meanwhile fails with HAProxy's own 503; after, none fails."""
    require_haproxy()
    server = named_servers[0]
    before = _door(tmp_path, "before", server, hold=False)
    after = _door(tmp_path, "after", server, hold=True)
    try:
        failed_before = _outage(before, "before", server)
        failed_after = _outage(after, "after", server)
    finally:
        before.stop()
        after.stop()
    print(
        f"no engine ready, {CLIENTS} requests: without the hold {dict(failed_before)}, "
        f"with it {dict(failed_after)}"
    )
    assert failed_before == Counter({"503": CLIENTS})
    assert failed_after == Counter({"s0": CLIENTS})


def test_a_request_waits_at_most_the_queue_timeout_then_fails(
    tmp_path: Path, named_servers: list[NamedServer]
) -> None:
    """No engine comes back: every request is answered an error after `timeout queue` (the one on the
    `hold` slot 504, the queued ones 503), none hangs."""
    require_haproxy()
    door = _door(tmp_path, "bounded", named_servers[0], hold=True, queue_timeout_s=1)
    try:
        _run("set server ep_bounded/e1 state maint", door)
        answers = Burst(door).join()
    finally:
        door.stop()
    assert sum(answers.values()) == CLIENTS and set(answers) <= {"503", "504"}, answers


def test_the_keeper_leaves_the_hold_alone_and_requests_wait_for_the_next_ready_engine(
    settings: Settings,
    db_engine: DbEngine,
    haproxy: RunningDoor,
    named_servers: list[NamedServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every engine out (fenced), then one serving again: the requests sent meanwhile wait and are answered
    by it. The keeper never takes the `hold` server for a slot, nor puts it in maintenance."""
    _deployment(db_engine, named_servers, size=2)
    with TestClient(_app(settings, haproxy, monkeypatch), headers=ADMIN_HEADERS) as client:
        _applied(client)
        _set_engine(db_engine, "fd-engine-0", state="fenced")
        _set_engine(db_engine, "fd-engine-1", state="fenced")
        _applied(client)
        burst = Burst(haproxy)
        wait_until(
            lambda: burst.settled_or_waiting(haproxy, "fd"),
            timeout_s=30,
            what="the burst answered or waiting",
        )
        _set_engine(db_engine, "fd-engine-1", state="serving")
        _applied(client)
        answers = burst.join()
        servers = asyncio.run(RuntimeApi(haproxy.socket_path).servers("ep_fd"))
    assert answers == Counter({"s1": CLIENTS}), answers
    assert servers["hold"].state == "ready"
