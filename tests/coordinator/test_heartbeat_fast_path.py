"""The steady heartbeat answered ahead of FastAPI (`app.deployments.engines.fast_path`, issue 37): the
same answers, errors, metrics and records as the FastAPI route, for every heartbeat, through both paths
(`heartbeat_fast_path` on and off); the fast path answers the steady ones, and hands every other one to
the route untouched."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from app.core.config import Settings
from app.deployments.engines import batch, fast_path
from app.main import create_app
from app.metrics import HTTP_REQUESTS
from tests.support.fixtures import ADMIN_HEADERS, token_headers
from tests.support.fleet import make_fleet

ROUTE = "/v1/engines/{engine_id}/heartbeat"
ENGINES = 4
STEADY = {"state": "serving", "generation": 1, "rank": 0, "world_size": ENGINES}


@pytest.fixture(params=[True, False], ids=["fast-path", "fastapi-route"])
def fast(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def _client(settings: Settings, monkeypatch: pytest.MonkeyPatch, fast: bool) -> TestClient:
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    app = create_app(
        settings.model_copy(update={"webhook_worker_enabled": False, "heartbeat_fast_path": fast})
    )
    return TestClient(app, headers=ADMIN_HEADERS)


@pytest.fixture
def both(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> Iterator[dict[bool, TestClient]]:
    """Two coordinators on two databases with the same fleet: the fast path on, and off."""
    clients = {}
    for on in (True, False):
        url = settings.database_url
        if not on:  # a second database of its own, at head
            from tests.support.databases import sqlite_database

            (tmp_path / "route").mkdir()
            url = sqlite_database(tmp_path / "route", migrated=True)
        clients[on] = _client(settings.model_copy(update={"database_url": url}), monkeypatch, on)
    with clients[True] as a, clients[False] as b:
        make_fleet(a, ENGINES)
        make_fleet(b, ENGINES)
        yield {True: a, False: b}


class Answered:
    """Which heartbeats the fast path answered itself (its `render` is the fast path's alone)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = fast_path.render

        def counting(answer: Any) -> Any:
            self.count += 1
            return real(answer)

        monkeypatch.setattr(fast_path, "render", counting)


def _normal(content: bytes) -> bytes:
    """The body, its times and ids (the two coordinators' own) blanked."""
    content = re.sub(rb'"\d{4}-\d\d-\d\dT[0-9:.]+Z?"', b'"<time>"', content)
    return re.sub(rb'"dep_[0-9a-z]+"', b'"<id>"', content)


def _shape(response: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers in order (not the date; the length of the body as blanked), the body blanked."""
    body = _normal(response.content)
    headers = [
        (k, str(len(body)).encode() if k == b"content-length" else v)
        for k, v in response.headers.raw
        if k != b"date"
    ]
    return response.status_code, headers, body


def test_a_steady_heartbeat_is_answered_by_the_fast_path_with_the_routes_answer(
    both: dict[bool, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    answered = Answered(monkeypatch)
    fast = both[True].post("/v1/engines/e0/heartbeat", json=STEADY)
    assert answered.count == 1
    route = both[False].post("/v1/engines/e0/heartbeat", json=STEADY)
    assert answered.count == 1  # the route's coordinator never takes the fast path
    assert fast.status_code == 200
    assert _shape(fast) == _shape(route)  # the same bytes but for times and ids
    assert fast.headers["content-type"] == "application/json"
    assert int(fast.headers["content-length"]) == len(fast.content)


BAD_REQUESTS = [
    pytest.param({"path": "/v1/engines/e0/heartbeat", "headers": {"Authorization": ""}}, id="no-token"),
    pytest.param(
        {"path": "/v1/engines/e0/heartbeat", "headers": {"Authorization": "Bearer epctl_nope"}},
        id="unknown-token",
    ),
    pytest.param({"path": "/v1/engines/e0/heartbeat", "headers": {"Authorization": "Basic abc"}}, id="basic"),
    pytest.param({"path": "/v1/engines/ghost/heartbeat"}, id="unknown-engine"),
    pytest.param({"path": "/v1/engines/-bad/heartbeat"}, id="bad-engine-id"),
    pytest.param({"path": "/v1/engines/e0/heartbeat", "json": {"state": "serving"}}, id="missing-field"),
    pytest.param({"path": "/v1/engines/e0/heartbeat", "json": STEADY | {"generation": "1"}}, id="not-strict"),
    pytest.param({"path": "/v1/engines/e0/heartbeat", "json": STEADY | {"extra": 1}}, id="extra-field"),
    pytest.param({"path": "/v1/engines/e0/heartbeat", "content": b"{nope"}, id="not-json"),
    pytest.param(
        {
            "path": "/v1/engines/e0/heartbeat",
            "content": json.dumps(STEADY).encode(),
            "headers": {"Content-Type": "text/plain"},
        },
        id="text-plain",
    ),
    pytest.param(
        {
            "path": "/v1/engines/e0/heartbeat",
            "json": STEADY | {"broken_generation": 1, "unresponsive_peers": ["e1"]},
        },
        id="broken-group",
    ),
]


def _numbers() -> list[str]:
    """Every field of the heartbeat whose schema says integer or number."""
    from app.deployments.engines.models import EngineHeartbeat

    def types(schema: dict[str, Any]) -> set[str]:
        return {schema.get("type", "")} | {t for option in schema.get("anyOf", []) for t in types(option)}

    fields = EngineHeartbeat.model_json_schema()["properties"]
    return sorted(name for name, schema in fields.items() if types(schema) & {"integer", "number"})


@pytest.mark.parametrize("field", _numbers())
def test_a_number_of_the_heartbeat_refuses_a_boolean_on_both_paths(
    both: dict[bool, TestClient], field: str
) -> None:
    """The schema says integer or number, so `false` is refused (the fuzzer's ST201 found `stuck_ms`
    taken as 0 by pydantic's lax mode), whichever path reads it."""
    assert {"stuck_ms", "stuck_generation", "generation"} <= set(_numbers())
    for client in both.values():
        answer = client.post(ROUTE.format(engine_id="e0"), json=STEADY | {field: False})
        assert answer.status_code == 422, (field, answer.text)


@pytest.mark.parametrize("request_", BAD_REQUESTS)
def test_every_other_heartbeat_gets_the_routes_answer(
    both: dict[bool, TestClient], request_: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    answered = Answered(monkeypatch)
    kwargs = {"json": STEADY} | {k: v for k, v in request_.items() if k != "path"}
    if "content" in kwargs:
        kwargs.pop("json")
    fast, route = (both[on].post(request_["path"], **kwargs) for on in (True, False))
    assert answered.count == 0
    assert _shape(fast) == _shape(route)


def test_a_token_without_the_engines_permission_is_refused_alike(
    both: dict[bool, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = []
    for on in (True, False):
        reader = token_headers(both[on], "viewer")
        both[on].get("/v1/deployments", headers=reader)  # the token is in the cache now
        answers.append(both[on].post("/v1/engines/e0/heartbeat", json=STEADY, headers=reader))
    assert answers[0].status_code == 403
    assert _shape(answers[0]) == _shape(answers[1])


def test_a_revoked_token_ends_at_once_on_the_fast_path(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path trusts only the authentication cache, which a revoke through this coordinator
    clears: the next heartbeat is refused (another coordinator's revoke: within `auth_cache_s`)."""
    make_fleet(client, ENGINES)
    answered = Answered(monkeypatch)
    created = client.post("/v1/tokens", json={"name": "agents", "role": "operator"})
    assert created.status_code == 201, created.text
    agent = {"Authorization": f"Bearer {created.json()['token']}"}
    assert client.post("/v1/engines/e0/heartbeat", json=STEADY, headers=agent).status_code == 200
    assert client.post("/v1/engines/e0/heartbeat", json=STEADY, headers=agent).status_code == 200
    assert answered.count == 1  # the first (not in the cache yet) through the route, which caches it
    assert client.delete(f"/v1/tokens/{created.json()['id']}").status_code in (200, 204)
    refused = client.post("/v1/engines/e0/heartbeat", json=STEADY, headers=agent)
    assert refused.status_code == 401
    assert answered.count == 1


def test_the_fast_path_counts_in_the_routes_metrics(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_fleet(client, ENGINES)
    answered = Answered(monkeypatch)
    labels = {"method": "POST", "route": ROUTE, "status": "200"}
    before = HTTP_REQUESTS.labels(**labels)._value.get()
    for i in range(ENGINES):
        assert client.post(f"/v1/engines/e{i}/heartbeat", json=STEADY | {"rank": i}).status_code == 200
    assert answered.count == ENGINES
    assert HTTP_REQUESTS.labels(**labels)._value.get() == before + ENGINES


def test_an_engine_the_batch_cannot_take_is_written_once_by_the_whole_path(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine id is unknown: the batch's statement finds no row, and the route answers 404 without
    running the batch's statement again."""
    make_fleet(client, ENGINES)
    calls: list[str] = []
    real = batch.HeartbeatBatches.record

    async def counting(self: batch.HeartbeatBatches, engine_id: str, heartbeat: Any, **kwargs: Any) -> Any:
        calls.append(engine_id)
        return await real(self, engine_id, heartbeat, **kwargs)

    monkeypatch.setattr(batch.HeartbeatBatches, "record", counting)
    missing = client.post("/v1/engines/ghost/heartbeat", json=STEADY)
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert calls == ["ghost"]


def test_a_database_failure_is_answered_as_the_route_answers_it(
    both: dict[bool, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing(self: batch.HeartbeatBatches, engine_id: str, heartbeat: Any, **kwargs: Any) -> Any:
        raise sa.exc.OperationalError("UPDATE engines", {}, Exception("database is locked"))

    monkeypatch.setattr(batch.HeartbeatBatches, "record", failing)
    fast, route = (both[on].post("/v1/engines/e0/heartbeat", json=STEADY) for on in (True, False))
    assert fast.status_code == 503, fast.text
    assert _shape(fast) == _shape(route)


def test_fast_path_setting_reaches_the_app(
    fast: bool, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both settings answer a steady heartbeat 200; only `true` takes the fast path."""
    answered = Answered(monkeypatch)
    with _client(settings, monkeypatch, fast) as client:
        make_fleet(client, ENGINES)
        assert client.post("/v1/engines/e1/heartbeat", json=STEADY | {"rank": 1}).status_code == 200
        assert client.get("/v1/engines/e1").json()["generation"] == 1
    assert answered.count == (1 if fast else 0)


def test_a_stuck_report_is_noted_and_a_plain_heartbeat_ends_it_on_both_paths(
    both: dict[bool, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39's stuck reports live in the coordinator's memory (`app.core.stuck`): the fast path hands a
    heartbeat carrying one to the route (which notes it and wakes the liveness pass), and a plain
    heartbeat it answers itself still ends the engine's report."""
    from app.core.stuck import STUCK

    stuck = STEADY | {"stuck_generation": 1, "stuck_ms": 700.0, "stuck_unanswered": ["e1"]}
    for on in (True, False):
        answered = Answered(monkeypatch)
        assert both[on].post("/v1/engines/e0/heartbeat", json=stuck).status_code == 200
        assert answered.count == 0  # the route's
        report = STUCK.snapshot().get("e0")
        assert report is not None and report.generation == 1 and report.unanswered == ("e1",)
        assert both[on].post("/v1/engines/e0/heartbeat", json=STEADY).status_code == 200
        assert answered.count == (1 if on else 0)
        assert "e0" not in STUCK.snapshot()


@pytest.mark.parametrize("stuck_ms", [1e300, -1.0])
def test_a_stuck_report_out_of_range_is_a_422_on_both_paths(
    both: dict[bool, TestClient], stuck_ms: float
) -> None:
    """Found by the fuzzer: a wait of 1e300 ms overflowed the coordinator's clock arithmetic (a 500)."""
    body = STEADY | {"stuck_generation": 1, "stuck_ms": stuck_ms}
    for on in (True, False):
        answer = both[on].post("/v1/engines/e0/heartbeat", json=body)
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
