"""Issue 17: hostile input gets a 4xx problem (never a 5xx), the same on SQLite and Postgres, and
changes nothing (findings 4, 6, 8, 9, 10 and 11's unknown fields)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from app.deployments.engines.models import Engine as EngineRow
from tests.support.fixtures import token_headers

# The database's own behaviour is part of what these check (tests/support/databases.py).
pytestmark = pytest.mark.databases("sqlite", "postgres")

PROBLEM = "application/problem+json"


def assert_problem(response: object, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    assert response.headers["content-type"] == PROBLEM  # type: ignore[attr-defined]
    if code is not None:
        assert response.json()["code"] == code  # type: ignore[attr-defined]


@pytest.fixture
def demo(client: TestClient) -> dict[str, object]:
    created = client.post("/v1/deployments", json={"name": "demo", "launcher": "static"})
    assert created.status_code == 201, created.text
    return dict(created.json())


def registration(demo: dict[str, object], engine_id: str, **fields: object) -> dict[str, object]:
    body = {
        "engine_id": engine_id,
        "deployment": "demo",
        "url": "http://127.0.0.1:9000",
        "platform": "cpu",
        "device": "cpu",
        "engine": demo["engine"],
    }
    return {**body, **fields}


def engines_saved(db_engine: Engine) -> int:
    with Session(db_engine) as session:
        return int(session.exec(select(func.count()).select_from(EngineRow)).one())


# --- finding 4: body size, before parsing or authentication -------------------------------------------


def test_a_body_over_the_limit_is_413_before_authentication(app: object, client: TestClient) -> None:
    anonymous = TestClient(app)  # type: ignore[arg-type]
    big = b'{"x": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    for path in ("/v1/hooks/scale", "/v1/reconfigurations", "/v1/tokens"):
        assert_problem(anonymous.post(path, content=big), 413, "body-too-large")

    def chunks() -> object:
        for _ in range(40):
            yield b"a" * 65536  # no Content-Length: cut off once past the limit

    assert_problem(anonymous.post("/v1/hooks/scale", content=chunks()), 413, "body-too-large")  # type: ignore[arg-type]


# --- finding 6: engine ids -----------------------------------------------------------------------------


@pytest.mark.parametrize("engine_id", ["日本", "a\nb", "a/b", "a b", "-a", "", "x" * 129, "a\x00b"])
def test_an_unsafe_engine_id_is_422_and_saves_nothing(
    client: TestClient, db_engine: Engine, demo: dict[str, object], engine_id: str
) -> None:
    response = client.post("/v1/engines", json=registration(demo, engine_id))
    assert_problem(response, 422)
    assert engines_saved(db_engine) == 0


def test_a_safe_engine_id_registers_and_can_be_deleted(client: TestClient, demo: dict[str, object]) -> None:
    for engine_id in ("demo-1f3a9c2e", "agent-host.example-4242", "agent-::1-99", "E_0"):
        assert client.post("/v1/engines", json=registration(demo, engine_id)).status_code == 201
        assert client.delete(f"/v1/engines/{engine_id}").status_code == 204


def test_engine_numbers_beyond_the_stored_columns_are_422(
    client: TestClient, demo: dict[str, object]
) -> None:
    for fields in ({"generation": 2**63}, {"generation": 2**31}, {"rank": -1}, {"rank": 2**40}):
        assert_problem(client.post("/v1/engines", json=registration(demo, "e1", **fields)), 422)
    assert client.post("/v1/engines", json=registration(demo, "e1")).status_code == 201
    for heartbeat in (
        {"state": "serving", "generation": 2**63},
        {"state": "serving", "generation": 0, "world_size": 2**33},
    ):
        assert_problem(client.post("/v1/engines/e1/heartbeat", json=heartbeat), 422)


# --- finding 8: webhook URLs -------------------------------------------------------------------------


def test_webhook_urls_with_credentials_are_redacted_for_every_role_but_admin(client: TestClient) -> None:
    secret_url = "https://user:hunter2@hooks.example.com/services/T0/B0/XXXX?token=abc"
    created = client.post("/v1/webhooks", json={"url": secret_url})
    assert created.status_code == 201
    hook_id = created.json()["id"]
    assert client.get(f"/v1/webhooks/{hook_id}").json()["url"] == secret_url
    for role in ("viewer", "autoscaler", "operator"):
        headers = token_headers(client, role, f"{role}-reader")
        for shown in (
            client.get(f"/v1/webhooks/{hook_id}", headers=headers).json()["url"],
            client.get("/v1/webhooks", headers=headers).json()["data"][0]["url"],
        ):
            assert "hunter2" not in shown and "XXXX" not in shown and "abc" not in shown
            assert shown.startswith("https://***@hooks.example.com/")


# URLs the coordinator would call later, which its HTTP clients cannot send to (found by schemathesis: a
# webhook URL holding `\x17` failed every delivery attempt with an error in the log; an engine URL
# `http://[` was stored).
UNSENDABLE_URLS = [
    "http://a\x17b.example/",
    "http://[",
    "http://host:99999/",
    "http://host:port/",
    "http:///x",
]


@pytest.mark.parametrize("url", UNSENDABLE_URLS)
def test_a_url_no_client_can_send_to_is_422_and_saves_nothing(
    client: TestClient, db_engine: Engine, demo: dict[str, object], url: str
) -> None:
    assert_problem(client.post("/v1/webhooks", json={"url": url}), 422)
    assert client.get("/v1/webhooks").json()["count"] == 0
    assert_problem(client.post("/v1/engines", json=registration(demo, "e1", url=url)), 422)
    assert engines_saved(db_engine) == 0
    vllm = {"name": "v", "backend": "vllm", "launcher": "static", "vllm": {"url": url}}
    assert_problem(client.post("/v1/deployments", json=vllm), 422)
    assert client.get("/v1/deployments/v").status_code == 404


# --- finding 9: query values that used to be 500s ---------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "日本語"},
        {"cursor": "ünïcode-cursor"},
        {"created_after": "0001-01-01T00:00:00+14:00"},
        {"created_before": "9999-12-31T23:59:59-14:00"},
        {"deployment": "a\x00b"},
    ],
)
def test_list_query_values_that_overflowed_are_4xx(client: TestClient, params: dict[str, str]) -> None:
    response = client.get("/v1/reconfigurations", params=params)
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"] == PROBLEM


def test_offsets_beyond_64_bits_are_422(client: TestClient) -> None:
    created = client.post("/v1/webhooks", json={"url": "https://hooks.example/x"}).json()
    for path in ("/v1/hooks/requests", f"/v1/webhooks/{created['id']}/deliveries"):
        for offset in (2**63, 2**64, 10**30):
            assert_problem(client.get(path, params={"offset": offset}), 422)


def test_a_huge_last_event_id_is_refused_before_the_stream(
    client: TestClient, demo: dict[str, object]
) -> None:
    with Session(client.app.state.db_engine) as session:  # type: ignore[attr-defined]
        from app.deployments.models import Deployment
        from tests.support.factories import register_engines

        deployment = session.exec(select(Deployment)).one()
        register_engines(session, deployment, 2)
    job = client.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2}).json()
    for value in (b"9" * 30, b"9" * 5000, b"18446744073709551616", "١٢".encode()):
        response = client.get(f"/v1/reconfigurations/{job['id']}/events", headers={"Last-Event-ID": value})  # type: ignore[dict-item]
        assert 400 <= response.status_code < 500, response.text
    assert_problem(client.get(f"/v1/reconfigurations/{job['id']}/events?last_event_id={2**64}"), 422)


# --- finding 10: numbers JSON cannot hold ----------------------------------------------------------


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_an_infinite_cooldown_is_refused(client: TestClient, demo: dict[str, object], literal: str) -> None:
    raw = '{"autoscale_cooldown_s": ' + literal + "}"
    response = client.patch("/v1/deployments/demo", content=raw, headers={"content-type": "application/json"})
    assert_problem(response, 422)
    assert client.get("/v1/deployments/demo").json()["autoscale_cooldown_s"] == 60.0


# --- finding 11: unknown fields ---------------------------------------------------------------------


def test_an_unknown_field_is_422_naming_it(client: TestClient, demo: dict[str, object]) -> None:
    body = {"deployment": "demo", "target_dp_size": 2, "warmup_polcy": "deferred"}
    response = client.post("/v1/reconfigurations", json=body)
    assert_problem(response, 422, "validation-error")
    assert response.json()["unknown_fields"] == ["warmup_polcy"]
    assert "warmup_polcy" in response.json()["detail"]
    assert client.get("/v1/reconfigurations").json()["count"] == 0
    for path, bad in (
        ("/v1/deployments", {"name": "other", "max_dp_sise": 4}),
        ("/v1/tokens", {"name": "t", "role": "viewer", "expires": "never"}),
        ("/v1/webhooks", {"url": "http://127.0.0.1:9/", "events": ["x"]}),
    ):
        assert client.post(path, json=bad).json()["unknown_fields"] == [
            next(k for k in bad if k not in ("name", "role", "url"))
        ]


# --- the same on both databases ---------------------------------------------------------------------


def test_nul_characters_are_refused_identically(client: TestClient, demo: dict[str, object]) -> None:
    body = {"deployment": "demo", "target_dp_size": 2, "reason": "a\x00b"}
    assert_problem(
        client.post(
            "/v1/reconfigurations", content=json.dumps(body), headers={"content-type": "application/json"}
        ),
        422,
        "invalid-characters",
    )
    assert_problem(client.get("/v1/reconfigurations?deployment=%00"), 400, "invalid-characters")
