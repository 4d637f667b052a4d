"""Engines serving HTTPS behind the front door (issue 35): HAProxy's slots speak TLS to them, verifying
their certificates against the deployment's CA (`ssl verify required ca-file`), on a real HAProxy."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.core.config import Settings
from app.deployments.engines.models import Engine
from app.frontdoor.haproxy import DoorConfig, RuntimeApi
from app.frontdoor.launch import RunningDoor, start_front_door
from app.frontdoor.settings import FrontDoorSpec
from app.main import create_app
from tests.frontdoor.conftest import NamedServer, require_haproxy
from tests.support.certs import TestCA
from tests.support.factories import static_deployment
from tests.support.fixtures import ADMIN_HEADERS
from tests.support.processes import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes  # a real HAProxy


@pytest.fixture
def cas(tmp_path: Path) -> tuple[TestCA, TestCA]:
    return TestCA(tmp_path / "pki", "ours"), TestCA(tmp_path / "pki", "theirs")


@pytest.fixture
def tls_door(tmp_path: Path, cas: tuple[TestCA, TestCA]) -> Iterator[RunningDoor]:
    require_haproxy()
    config = DoorConfig("fd", "127.0.0.1", free_port(), slots=4, tls_ca_file=str(cas[0].ca_file))
    door = start_front_door(tmp_path / "front-door", config)
    yield door
    door.stop()


def test_engines_serving_https_are_reached_over_verified_tls(
    settings: Settings,
    db_engine: DbEngine,
    tls_door: RunningDoor,
    cas: tuple[TestCA, TestCA],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three engines of one generation: one with a certificate our CA signed (served), one whose
    certificate another CA signed (HAProxy refuses the handshake and sends its requests on to the
    first), one serving plain HTTP (the slots speak TLS: kept out). Every request is answered, by the
    first engine only."""
    ours, theirs = cas
    servers = [
        NamedServer("s0", tls=ours.server("s0")),
        NamedServer("s1", tls=theirs.server("s1")),
        NamedServer("s2"),
    ]
    try:
        with Session(db_engine) as session:
            deployment = static_deployment(session, "fd", engines=len(servers))
            deployment.generation, deployment.current_dp_size = 1, len(servers)
            session.add(deployment)
            for index, server in enumerate(servers):
                row = session.get(Engine, f"fd-engine-{index}")
                assert row is not None
                row.url, row.state, row.dp_rank, row.generation = server.url, "serving", index, 1
                session.add(row)
            session.commit()
        monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
        app = create_app(settings.model_copy(update={"webhook_worker_enabled": False}))
        app.state.front_doors = [
            FrontDoorSpec(
                deployment="fd",
                url=tls_door.url,
                socket=tls_door.socket_path,
                poll_s=0.05,
                tls_ca_file=str(ours.ca_file),
            )
        ]
        with TestClient(app, headers=ADMIN_HEADERS):
            (keeper,) = app.state.front_door_keepers
            wait_until(lambda: keeper.applied is not None, timeout_s=30, what="the keeper applies the feed")
            states = asyncio.run(RuntimeApi(tls_door.socket_path).servers("ep_fd"))
            slots = {engine_id: states[slot].state for engine_id, slot in keeper.slots.items()}
            assert slots.get("fd-engine-2", "maint") == "maint"  # plain HTTP: kept out
            assert slots["fd-engine-0"] == slots["fd-engine-1"] == "ready"
            with httpx.Client(base_url=tls_door.url, timeout=10) as http:
                answers = [http.post("/v1/infer", content=b"x") for _ in range(12)]
            assert [a.status_code for a in answers] == [200] * 12
            assert {a.text for a in answers} == {"s0"}
    finally:
        for server in servers:
            server.close()
