"""The HAProxy keeper on a real HAProxy: the front door says what the feed says."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.core.config import Settings
from app.deployments.engines.models import Engine
from app.frontdoor.haproxy import RuntimeApi, frontend_name, host_port
from app.frontdoor.keeper import KEEPERS
from app.frontdoor.launch import RunningDoor
from app.frontdoor.models import EndpointSetPublic
from app.frontdoor.publish import Ahead, Written, serve_ahead, write
from app.frontdoor.settings import FrontDoorSpec
from app.jobs.async_record import WorkerSessions
from app.jobs.models import ReconfigurationJob
from app.main import create_app
from app.probe.canary import CANARY_HEADER
from tests.frontdoor.conftest import NamedServer
from tests.support.factories import set_row, static_deployment
from tests.support.fixtures import ADMIN_HEADERS
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes  # a real HAProxy


def _app(settings: Settings, door: RunningDoor, monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    app = create_app(settings.model_copy(update={"webhook_worker_enabled": False}))
    app.state.front_doors = [
        FrontDoorSpec(deployment="fd", url=door.url, socket=door.socket_path, poll_s=0.05)
    ]
    return app


def _deployment(db_engine: DbEngine, servers: list[NamedServer], size: int) -> None:
    with Session(db_engine) as session:
        deployment = static_deployment(session, "fd", engines=len(servers))
        deployment.generation, deployment.current_dp_size = 1, size
        session.add(deployment)
        for index, server in enumerate(servers):
            row = session.get(Engine, f"fd-engine-{index}")
            assert row is not None
            row.url = server.url
            row.state, row.dp_rank, row.generation = (
                ("serving", index, 1) if index < size else ("idle", None, 0)
            )
            session.add(row)
        session.commit()


def _set_engine(db_engine: DbEngine, engine_id: str, **fields: Any) -> None:
    set_row(db_engine, Engine, engine_id, **fields)


def _applied(client: TestClient) -> dict[str, Any]:
    """The feed once the front door applied its current version."""

    def check() -> dict[str, Any] | None:
        body = client.get("/v1/deployments/fd/endpoints").json()
        door = body["front_door"]
        return body if door and door["applied_version"] == body["resourceVersion"] else None

    return wait_until(check, timeout_s=30, what="the front door applies the feed's version")


def _answers(door: RunningDoor, count: int) -> Counter[str]:
    with httpx.Client(base_url=door.url, timeout=10) as http:
        return Counter(http.post("/v1/infer", content=b"x").text for _ in range(count))


def test_the_front_door_sends_only_to_ready_engines_and_follows_each_change(
    settings: Settings,
    db_engine: DbEngine,
    haproxy: RunningDoor,
    named_servers: list[NamedServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _deployment(db_engine, named_servers, size=2)
    with TestClient(_app(settings, haproxy, monkeypatch), headers=ADMIN_HEADERS) as client:
        feed = _applied(client)
        assert feed["front_door"]["url"] == haproxy.url
        assert "haproxy" in feed["front_door"]["keeper"]
        assert set(_answers(haproxy, 12)) == {"s0", "s1"}  # s2 is idle: out
        with httpx.Client(base_url=haproxy.url, timeout=10) as http:  # our canaries: counted apart
            for _ in range(3):
                http.post("/v1/infer", content=b"x", headers={CANARY_HEADER: "1"}).raise_for_status()
        counted = asyncio.run(RuntimeApi(haproxy.socket_path).senders(frontend_name("fd")))
        assert {k: v["http_req_cnt"] for k, v in counted.items()} == {"client": 12, "canary": 3}

        _set_engine(db_engine, "fd-engine-1", state="fenced")
        _applied(client)
        assert set(_answers(haproxy, 8)) == {"s0"}

        # Written off (left) while its generation serves: listed out (lost), and sent nothing.
        _set_engine(db_engine, "fd-engine-2", state="serving", dp_rank=1, generation=1)
        _set_engine(db_engine, "fd-engine-1", state="left", dp_rank=None)
        feed = _applied(client)
        lost = [(e["engine_id"], e["state"], e["reason"]) for e in feed["endpoints"] if e["state"] == "out"]
        assert lost == [("fd-engine-1", "out", "lost")], feed
        assert set(_answers(haproxy, 12)) == {"s0", "s2"}


def test_a_restarted_keeper_takes_over_the_slots_haproxy_serves(
    settings: Settings,
    db_engine: DbEngine,
    haproxy: RunningDoor,
    named_servers: list[NamedServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _deployment(db_engine, named_servers, size=2)
    with TestClient(_app(settings, haproxy, monkeypatch), headers=ADMIN_HEADERS) as client:
        _applied(client)
    # The coordinator is gone: HAProxy serves on the last rank set it was given.
    assert set(_answers(haproxy, 8)) == {"s0", "s1"}
    app = _app(settings, haproxy, monkeypatch)
    with TestClient(app, headers=ADMIN_HEADERS) as client:
        feed = _applied(client)
        (keeper,) = app.state.front_door_keepers
        wait_until(
            lambda: keeper.applied == feed["resourceVersion"], timeout_s=30, what="the new keeper applies"
        )
        assert sorted(keeper.slots.items()) == [("fd-engine-0", "e1"), ("fd-engine-1", "e2")]
        assert set(_answers(haproxy, 8)) == {"s0", "s1"}


def test_a_version_a_job_offers_is_applied_at_once_and_never_undone_by_an_older_read(
    settings: Settings,
    db_engine: DbEngine,
    haproxy: RunningDoor,
    named_servers: list[NamedServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's front-door step hands its new version to the keeper of this process (`offer`): applied
    before the call returns, and the keeper's own reads of an older version do not take it back."""
    _deployment(db_engine, named_servers, size=2)
    app = _app(settings, haproxy, monkeypatch)
    with TestClient(app, headers=ADMIN_HEADERS) as client:
        feed = _applied(client)
        (keeper,) = app.state.front_door_keepers
        wait_until(lambda: keeper.in_sync, timeout_s=30, what="the keeper in step")
        newer = EndpointSetPublic.model_validate(
            {
                **feed,
                "resourceVersion": feed["resourceVersion"] + 1,
                "endpoints": [e for e in feed["endpoints"] if e["engine_id"] != "fd-engine-1"],
            }
        )
        deployment_id = next(iter(KEEPERS))
        assert client.portal is not None
        client.portal.call(keeper.offer, deployment_id, newer)
        assert keeper.applied == newer.resource_version
        assert set(_answers(haproxy, 8)) == {"s0"}
        time.sleep(0.5)  # the loop re-reads the older version every 0.05 s meanwhile
        assert keeper.applied == newer.resource_version
        assert set(_answers(haproxy, 8)) == {"s0"}


def _slots(door: RunningDoor) -> dict[str, tuple[str, int, str]]:
    """HAProxy's engine slots that are not in maintenance: name -> (address, port, state)."""
    states = asyncio.run(RuntimeApi(door.socket_path).servers("ep_fd"))
    return {
        n: (s.host, s.port, s.state) for n, s in states.items() if n.startswith("e") and s.state != "maint"
    }


def test_a_deployment_larger_than_haproxys_slots_grows_its_backend_through_the_runtime_api(
    settings: Settings,
    db_engine: DbEngine,
    haproxy: RunningDoor,
    named_servers: list[NamedServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HAProxy started with 4 slots, a generation of 40 engines (3 that answer, 37 listening nowhere:
    nothing here checks their health): the keeper adds 36 slots (`add server`, no reload), each
    pointing at its engine and ready; shrunk back to the 3, only they answer; and a restarted keeper
    takes the added slots over as they are. 64 engines or more need no other configuration."""
    size = 40
    with Session(db_engine) as session:
        deployment = static_deployment(session, "fd", engines=size, max_dp_size=64)
        deployment.generation, deployment.current_dp_size = 1, size
        session.add(deployment)
        session.commit()
    nowhere = [f"http://127.0.0.1:{port}" for port in range(2, size - len(named_servers) + 2)]
    urls = [server.url for server in named_servers] + nowhere
    for index, url in enumerate(urls):
        _set_engine(db_engine, f"fd-engine-{index}", url=url, state="serving", dp_rank=index, generation=1)
    expected = {host_port(url) for url in urls}
    with TestClient(_app(settings, haproxy, monkeypatch), headers=ADMIN_HEADERS) as client:
        _applied(client)
        slots = _slots(haproxy)
        assert len(slots) == size and {(h, p) for h, p, _ in slots.values()} == expected, slots
        assert {state for _, _, state in slots.values()} == {"ready"}
        for index in range(len(named_servers), size):
            _set_engine(db_engine, f"fd-engine-{index}", state="left", dp_rank=None)
        _applied(client)
        assert set(_answers(haproxy, 12)) == {"s0", "s1", "s2"}
        for index in range(len(named_servers), size):
            _set_engine(db_engine, f"fd-engine-{index}", state="serving", dp_rank=index)
        _applied(client)
        assert len(_slots(haproxy)) == size
    app = _app(settings, haproxy, monkeypatch)
    with TestClient(app, headers=ADMIN_HEADERS) as client:
        feed = _applied(client)
        (keeper,) = app.state.front_door_keepers
        wait_until(
            lambda: keeper.applied == feed["resourceVersion"], timeout_s=30, what="the new keeper applies"
        )
        assert len(keeper.slots) == size and len(_slots(haproxy)) == size


def test_a_commit_is_served_at_the_front_door_before_its_version_is_written(
    settings: Settings,
    db_engine: DbEngine,
    haproxy: RunningDoor,
    named_servers: list[NamedServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that saw every participant commit gives HAProxy the new rank set first (`serve_ahead`:
    reads only), then writes its results and the feed's version. With SQLite's write lock held
    elsewhere (a busy coordinator: heartbeats, the probe's recordings), the joiner already answers at
    the front door while the write waits; the version written says the same set, so the step counts
    the set in service from HAProxy's answer, before the write ended."""
    if not settings.database_url.startswith("sqlite:///"):
        pytest.skip("holds SQLite's write lock")
    _deployment(db_engine, named_servers, size=2)
    app = _app(settings, haproxy, monkeypatch)
    with TestClient(app, headers=ADMIN_HEADERS) as client:
        response = client.post("/v1/reconfigurations", json={"deployment": "fd", "target_dp_size": 3})
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]
        plan = [{"engine_id": f"fd-engine-{i}", "role": "joining" if i == 2 else "staying"} for i in range(3)]
        with Session(db_engine) as session:
            job = session.get(ReconfigurationJob, job_id)
            assert job is not None
            job.state, job.engine_results = "committing", plan
            session.add(job)
            session.commit()
        feed = _applied(client)
        assert {e["engine_id"]: e["state"] for e in feed["endpoints"]}["fd-engine-2"] == "out"
        (keeper,) = app.state.front_door_keepers
        wait_until(lambda: keeper.in_sync, timeout_s=30, what="the keeper in step")
        committed = [
            {**p, "new_rank": i, "generation_before": 1 if i < 2 else 0, "generation_after": 2}
            for i, p in enumerate(plan)
        ]

        def switched(session: Session) -> None:
            row = session.get(ReconfigurationJob, job_id)
            assert row is not None
            row.engine_results = committed
            session.add(row)
            session.commit()

        blocker = sqlite3.connect(settings.database_url.removeprefix("sqlite:///"), check_same_thread=False)
        in_session = WorkerSessions(db_engine).run_in_session
        deployment_id = next(iter(KEEPERS))

        async def commit() -> tuple[Ahead | None, Counter[str], bool, Written]:
            blocker.execute("BEGIN IMMEDIATE")  # the write lock, elsewhere
            ahead = await serve_ahead(in_session, deployment_id, (job_id, "committing"), committed)
            writing = asyncio.create_task(write(in_session, deployment_id, before=switched, ahead=ahead))
            served = await asyncio.to_thread(_answers, haproxy, 12)
            waiting = not writing.done()
            blocker.rollback()
            return ahead, served, waiting, await writing

        assert client.portal is not None
        ahead, served, waiting, written = client.portal.call(commit)
        blocker.close()
        assert ahead is not None and waiting
        assert set(served) == {"s0", "s1", "s2"}  # the joiner serves while the write waits
        assert written.served_at == ahead.served_at  # the version says what HAProxy was given
        assert {e["engine_id"]: e["state"] for e in _applied(client)["endpoints"]} == {
            "fd-engine-0": "ready",
            "fd-engine-1": "ready",
            "fd-engine-2": "ready",
        }
        assert set(_answers(haproxy, 12)) == {"s0", "s1", "s2"}
