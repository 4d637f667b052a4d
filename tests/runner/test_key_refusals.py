"""An engine that refuses the coordinator's agent key (issue 32), in-process on a real database: its
heartbeat's key check names it, the deployment shows the condition `engine-refuses-agent-key` and is not
`ready` over it, self-healing does not count it, a job is refused naming it, and a rotation that cannot
push to it has its launcher stop it (a static agent is named for its operator). No agent process: the
rotation's push goes to a stand-in agent (a real HTTP server on loopback) that refuses every key."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.backends.reference.liveness.health import REASON_KEY_REFUSED, assess
from app.backends.reference.liveness.observe import engine_seen
from app.core.clock import utc_now
from app.core.errors import ConflictError
from app.core.sealing import SealingError, seal
from app.deployments.agent_keys import (
    AgentKeyRotate,
    KeyVerdicts,
    SealedKeys,
    agent_keys_of,
    holds_another_key,
    rotate,
)
from app.deployments.engines.models import Engine, refuses_key
from app.deployments.engines.service import conditions, record_heartbeat, record_steady_heartbeat
from app.deployments.models import Deployment
from app.launchers.base import EnginesToRestart
from engine_agent.protocol import AgentHeartbeat, AgentState, key_check
from tests.runner.test_heartbeats import controller, deployment_with
from tests.support.factories import make_job


def keys_of(db: DbEngine, deployment_id: str) -> tuple[str, ...]:
    with Session(db) as session:
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None
        return agent_keys_of(deployment)


def beat(db: DbEngine, engine_id: str, rank: int, check: str | None, *, steady: bool = False) -> None:
    """A heartbeat through `record_heartbeat`, or (`steady`) as the route takes it: the one-statement
    path first (`record_steady_heartbeat`), the whole one when that path declines."""
    with Session(db) as session:
        heartbeat = AgentHeartbeat(
            state=AgentState.serving, generation=1, rank=rank, world_size=2, key_check=check
        )
        if steady and record_steady_heartbeat(session, engine_id=engine_id, heartbeat=heartbeat) is not None:
            return
        record_heartbeat(session, engine_id=engine_id, heartbeat=heartbeat)


def engine_row(db: DbEngine, engine_id: str) -> Engine:
    with Session(db) as session:
        row = session.get(Engine, engine_id)
        assert row is not None
        return row


@pytest.mark.parametrize(
    ("reported", "sent", "refuses"),
    [
        (None, ("K2",), False),  # an agent that needs no key (started insecure) takes any
        ("K2", ("K2",), False),
        ("K1", ("K2", "K1"), False),  # not told yet, within the overlap: our fallback still opens it
        ("K1", ("K2",), True),  # the overlap ended before it was told
        ("KX", ("K2", "K1"), True),  # a key we never had
        ("KX", (), False),  # a deployment without a key (made before keys existed)
    ],
)
def test_which_reported_key_refuses_the_coordinator(
    reported: str | None, sent: tuple[str, ...], refuses: bool
) -> None:
    check = key_check(reported) if reported is not None else None
    assert holds_another_key(check, sent) is refuses


@pytest.mark.parametrize("steady", [False, True])
def test_a_heartbeat_with_another_key_is_a_condition_and_no_member(db_engine: DbEngine, steady: bool) -> None:
    deployment_id = deployment_with(db_engine, silent=[], idle=0)
    current = keys_of(db_engine, deployment_id)[0]
    beat(db_engine, "demo-engine-0", 0, key_check(current), steady=steady)
    beat(db_engine, "demo-engine-1", 1, key_check(current), steady=steady)
    beat(db_engine, "demo-engine-1", 1, key_check("epak_an-attackers-key-000000000"), steady=steady)
    assert refuses_key(engine_row(db_engine, "demo-engine-1"))
    assert not refuses_key(engine_row(db_engine, "demo-engine-0"))
    with Session(db_engine) as session:
        found = conditions(session, deployment_id=deployment_id)
        assert [(c.type, c.engine_id) for c in found] == [("engine-refuses-agent-key", "demo-engine-1")]
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None
        engines = session.exec(select(Engine).where(Engine.deployment_id == deployment_id)).all()
        seen = [engine_seen(e) for e in engines]
        health = assess(deployment.current_dp_size, deployment.generation, seen)
        assert not health.whole and health.reason == REASON_KEY_REFUSED and "demo-engine-1" in health.message
    # One liveness pass: degraded for it, and self-healing forms nothing over it (the engine serves; the
    # operator's rotation repairs it).
    assert asyncio.run(controller(db_engine).tick()).jobs == []
    with Session(db_engine) as session:
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None and deployment.status == "degraded"
        assert (deployment.status_detail or {}).get("reason") == REASON_KEY_REFUSED
        with pytest.raises(ConflictError) as refused:
            make_job(session, deployment, 3)
        assert refused.value.code == "engine-refuses-agent-key" and "demo-engine-1" in str(refused.value)
    # It takes the coordinator's key again (its operator restarted it with it): member again.
    beat(db_engine, "demo-engine-1", 1, key_check(current), steady=steady)
    assert not refuses_key(engine_row(db_engine, "demo-engine-1"))
    asyncio.run(controller(db_engine).tick())
    with Session(db_engine) as session:
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None and deployment.status == "ready"
        assert conditions(session, deployment_id=deployment_id) == []


@pytest.mark.parametrize("steady", [False, True])
def test_an_engine_on_the_previous_key_refuses_once_the_overlap_ends(
    db_engine: DbEngine, steady: bool
) -> None:
    deployment_id = deployment_with(db_engine, silent=[], idle=0)
    old = keys_of(db_engine, deployment_id)[0]
    beat(db_engine, "demo-engine-1", 1, key_check(old), steady=steady)
    with Session(db_engine) as session:
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None
        rotate(session, deployment, AgentKeyRotate(overlap_s=60))
    beat(db_engine, "demo-engine-1", 1, key_check(old), steady=steady)
    assert not refuses_key(engine_row(db_engine, "demo-engine-1"))  # not told yet, inside the overlap
    with Session(db_engine) as session:
        deployment = session.get(Deployment, deployment_id)
        assert deployment is not None
        deployment.agent_key_previous_until = utc_now() - timedelta(seconds=1)  # the overlap ends
        session.add(deployment)
        session.commit()
    beat(db_engine, "demo-engine-1", 1, key_check(old), steady=steady)
    assert refuses_key(engine_row(db_engine, "demo-engine-1"))


def test_a_key_verdict_is_kept_until_the_keys_change_or_the_previous_key_ends() -> None:
    """`KeyVerdicts`: the heartbeats' verdict per stored keys and reported check, with a fixed now."""
    now = utc_now()
    verdicts = KeyVerdicts()
    overlap = SealedKeys(seal("K2"), seal("K1"), now + timedelta(seconds=60))
    on_k1 = key_check("K1")
    assert verdicts.refused(overlap, on_k1, now) is False  # not told yet, inside the overlap
    assert verdicts.refused(overlap, on_k1, now + timedelta(seconds=59)) is False
    assert verdicts.refused(overlap, on_k1, now + timedelta(seconds=60)) is True  # the overlap ended
    assert verdicts.refused(overlap, key_check("K2"), now + timedelta(seconds=61)) is False
    # A rotation stores other keys: asked again at once (K2 becomes the previous key, K3 the current).
    rotated = SealedKeys(seal("K3"), seal("K2"), now + timedelta(seconds=60))
    assert verdicts.refused(rotated, key_check("K2"), now) is False
    assert verdicts.refused(rotated, on_k1, now) is True
    # A key that does not open is never kept: it raises each time.
    broken = SealedKeys("neither-marker", None, None)
    for _ in range(2):
        with pytest.raises(SealingError):
            verdicts.refused(broken, on_k1, now)


class RefusingAgent(BaseHTTPRequestHandler):
    """An agent that holds a key we do not: 401 to every call."""

    def do_POST(self) -> None:
        problem = {"code": "agent-key-invalid", "status": 401, "title": "Unauthorized", "detail": "wrong key"}
        body = json.dumps({"type": "urn:epctl:problem:agent-key-invalid", **problem}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/problem+json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_agent() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RefusingAgent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Reactions:
    """The backends' side of the rotation, as the deployments API sees it: records what it was asked."""

    def __init__(self, stops: bool) -> None:
        self.stops = stops
        self.asked: list[EnginesToRestart] = []

    async def deployment_created(self, name: str, backend: str) -> None: ...

    async def deployment_deleted(self, deleted: object) -> None: ...

    async def restart_engines(self, restart: EnginesToRestart) -> list[str]:
        self.asked.append(restart)
        return [e.engine_id for e in restart.engines] if self.stops else []


@pytest.mark.parametrize("launcher", ["local", "static"])
def test_a_rotation_restarts_what_refuses_it_or_names_it_for_the_operator(
    client: TestClient, db_engine: DbEngine, refusing_agent: str, launcher: str
) -> None:
    assert client.post("/v1/deployments", json={"name": "demo", "launcher": launcher}).status_code == 201
    registration = {"engine_id": "e0", "deployment": "demo", "url": refusing_agent, "platform": "cpu",
                    "device": "cpu", "engine": {}}  # fmt: skip
    assert client.post("/v1/engines", json=registration).status_code == 201
    reactions = Reactions(stops=launcher != "static")
    client.app.state.backends = reactions  # type: ignore[attr-defined]
    too_short = client.post("/v1/deployments/demo/agent-key/rotate", json={"overlap_s": 1})
    assert too_short.status_code == 422  # an overlap has a minimum (10 s)
    rotated = client.post("/v1/deployments/demo/agent-key/rotate", json={"overlap_s": 60})
    assert rotated.status_code == 200, rotated.text
    body = rotated.json()
    assert body["pushed_to"] == [] and "e0" in body["not_pushed"]
    assert [[e.engine_id for e in r.engines] for r in reactions.asked] == [["e0"]]
    assert reactions.asked[0].launcher == launcher
    if launcher == "static":
        assert body["restarted"] == [] and body["restart_by_operator"] == ["e0"]
        assert engine_row(db_engine, "e0").key_refused_at is not None
        shown = client.get("/v1/deployments/demo").json()["conditions"]
        assert [(c["type"], c["engine_id"]) for c in shown] == [("engine-refuses-agent-key", "e0")]
    else:
        assert body["restarted"] == ["e0"] and body["restart_by_operator"] == []
        # Stopped by its launcher: the next liveness pass finds it gone (connection refused) and judges
        # it lost, as it would any engine whose process died; self-healing takes it from there.
