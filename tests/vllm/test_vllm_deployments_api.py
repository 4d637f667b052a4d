"""`backend: vllm` deployments through the API (in process, both databases; no vLLM needed): what they
take, what they never show, and what they refuse."""

from __future__ import annotations

import socket
from typing import Any

from fastapi.testclient import TestClient

from tests.support.fixtures import token_headers


def closed_port_url() -> str:
    """A loopback URL nothing listens on (refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def vllm_body(name: str = "chat", **vllm: Any) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "vllm",
        "launcher": "static",
        "min_dp_size": 1,
        "max_dp_size": 4,
        "vllm": {"url": closed_port_url(), "api_key": "sk-very-secret-key", **vllm},
    }


def test_an_unreachable_server_registers_degraded_with_the_reason_and_no_size(client: TestClient) -> None:
    response = client.post("/v1/deployments", json=vllm_body(drain_timeout_s=30))
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["backend"] == "vllm"
    assert body["current_dp_size"] == 0
    assert body["status"] == "degraded"
    assert body["status_detail"]["reason"] == "engine-unreachable"
    assert "reconcile" in body["status_detail"]["hint"]
    assert body["vllm"]["drain_timeout_s"] == 30
    assert body["vllm"]["api_key_set"] is True


def test_the_api_key_is_never_shown(client: TestClient) -> None:
    client.post("/v1/deployments", json=vllm_body())
    for path in ("/v1/deployments", "/v1/deployments/chat"):
        text = client.get(path).text
        assert "sk-very-secret-key" not in text
        assert "api_key_set" in text
    assert "sk-very-secret-key" not in client.get("/openapi.json").text


def test_a_job_is_refused_while_the_servers_size_is_unknown(client: TestClient) -> None:
    client.post("/v1/deployments", json=vllm_body())
    response = client.post("/v1/reconfigurations", json={"deployment": "chat", "target_dp_size": 2})
    assert response.status_code == 409
    assert response.json()["code"] == "engine-size-unknown"


def test_vllm_settings_must_match_backend_and_launcher(client: TestClient) -> None:
    static_without_url = vllm_body()
    del static_without_url["vllm"]["url"]
    local_without_model = {**vllm_body(), "launcher": "local"}
    reference_with_vllm = {**vllm_body(), "backend": "reference"}
    vllm_without_settings = {k: v for k, v in vllm_body().items() if k != "vllm"}
    float_drain = vllm_body(drain_timeout_s=1.5)
    for body in (
        static_without_url,
        local_without_model,
        reference_with_vllm,
        vllm_without_settings,
        float_drain,
    ):
        response = client.post("/v1/deployments", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/deployments").json()["count"] == 0


def test_a_local_deployment_waits_for_its_server_to_be_started(client: TestClient) -> None:
    body = {**vllm_body(model="/models/tiny"), "launcher": "local"}
    del body["vllm"]["url"]
    response = client.post("/v1/deployments", json=body)
    assert response.status_code == 201, response.text
    detail = response.json()["status_detail"]
    assert detail["reason"] == "engine-not-started"
    assert "/engine/restart" in detail["hint"]
    patch = client.patch("/v1/deployments/chat", json={"vllm": {"url": "http://127.0.0.1:1"}})
    assert patch.status_code == 422
    assert patch.json()["code"] == "url-set-by-launcher"


def test_patch_changes_the_key_and_drain_timeout_only(client: TestClient) -> None:
    client.post("/v1/deployments", json=vllm_body())
    response = client.patch("/v1/deployments/chat", json={"vllm": {"api_key": "", "drain_timeout_s": 5}})
    assert response.status_code == 200, response.text
    assert response.json()["vllm"]["api_key_set"] is False
    assert response.json()["vllm"]["drain_timeout_s"] == 5
    assert response.json()["vllm"]["url"].startswith("http://127.0.0.1:")


def test_agents_cannot_register_into_a_vllm_deployment(client: TestClient) -> None:
    client.post("/v1/deployments", json=vllm_body())
    response = client.post(
        "/v1/engines",
        json={
            "engine_id": "e1",
            "deployment": "chat",
            "url": "http://127.0.0.1:9",
            "platform": "cpu",
            "device": "cpu",
            "engine": {},
        },
    )
    assert response.status_code == 409, response.text
    assert response.json()["code"] == "backend-mismatch"


def test_engine_routes_need_a_vllm_deployment_and_restart_a_local_launcher(client: TestClient) -> None:
    client.post("/v1/deployments", json={"name": "ref", "min_dp_size": 1, "max_dp_size": 2})
    assert client.get("/v1/deployments/ref/engine").json()["code"] == "backend-mismatch"
    client.post("/v1/deployments", json=vllm_body())
    view = client.get("/v1/deployments/chat/engine")
    assert view.status_code == 200, view.text
    assert view.json()["reachable"] is False
    restart = client.post("/v1/deployments/chat/engine/restart")
    assert restart.status_code == 422
    assert restart.json()["code"] == "not-locally-launched"


def test_only_operators_reconcile_or_restart(client: TestClient) -> None:
    client.post("/v1/deployments", json=vllm_body())
    viewer = token_headers(client, "viewer")
    assert client.get("/v1/deployments/chat/engine", headers=viewer).status_code == 200
    assert client.post("/v1/deployments/chat/engine/reconcile", headers=viewer).status_code == 403
    assert client.post("/v1/deployments/chat/engine/restart", headers=viewer).status_code == 403
    operator = token_headers(client, "operator")
    response = client.post("/v1/deployments/chat/engine/reconcile", headers=operator)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "degraded"


def test_the_api_key_is_sealed_at_rest(client: TestClient, session: Any, monkeypatch: Any) -> None:
    """Sealed with EPCTL_SECRET_KEY like the agent keys and webhook secrets (issue 32), and read back to
    call the server; a bare value written before sealing still reads."""
    from cryptography.fernet import Fernet
    from sqlmodel import select

    from app.core.sealing import SECRET_KEY_ENV, opened
    from app.deployments.models import Deployment

    monkeypatch.setenv(SECRET_KEY_ENV, Fernet.generate_key().decode())
    assert client.post("/v1/deployments", json=vllm_body(api_key="k" * 512)).status_code == 201
    assert client.patch("/v1/deployments/chat", json={"vllm": {"api_key": "sk-rotated"}}).status_code == 200
    session.expire_all()
    row = session.exec(select(Deployment).where(Deployment.name == "chat")).one()
    assert row.backend_secret.startswith("fernet:") and "sk-rotated" not in row.backend_secret
    assert opened(row.backend_secret) == "sk-rotated" and opened("sk-written-bare") == "sk-written-bare"
