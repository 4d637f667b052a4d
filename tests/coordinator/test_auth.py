"""Bearer tokens with roles; 401/403 as problem+json; secrets stored hashed and shown once."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.core.config import Settings
from app.main import create_app
from app.tokens.models import ApiToken
from tests.support.fixtures import token_headers


def test_requests_without_a_token_get_401_problem_with_a_challenge(client: TestClient) -> None:
    response = client.get("/v1/deployments", headers={"Authorization": ""})
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["code"] == "missing-token"
    # where a token comes from, for epctl's users: the option, the variable, the admin token's file
    assert all(w in response.json()["detail"] for w in ("--token", "EPCTL_TOKEN", "admin-token"))


def test_unknown_tokens_get_401(client: TestClient) -> None:
    response = client.get("/v1/deployments", headers={"Authorization": "Bearer epctl_nope"})
    assert response.status_code == 401 and response.json()["code"] == "invalid-token"


def test_a_created_token_works_and_its_secret_is_shown_only_once(client: TestClient) -> None:
    created = client.post("/v1/tokens", json={"name": "ci", "role": "viewer"})
    assert created.status_code == 201 and created.json()["token"].startswith("epctl_")
    listed = client.get("/v1/tokens").json()["data"]
    assert all("token" not in row for row in listed) and {"admin-env", "ci"} <= {r["name"] for r in listed}
    headers = {"Authorization": f"Bearer {created.json()['token']}"}
    assert client.get("/v1/deployments", headers=headers).status_code == 200


def test_tokens_are_stored_as_sha256_hashes(client: TestClient, db_engine: Engine) -> None:
    secret = client.post("/v1/tokens", json={"name": "ci", "role": "viewer"}).json()["token"]
    with Session(db_engine) as session:
        row = session.exec(select(ApiToken).where(ApiToken.name == "ci")).one()
    assert (
        row.token_hash == hashlib.sha256(secret.encode()).hexdigest() and secret not in row.model_dump_json()
    )


def test_a_revoked_token_is_refused(client: TestClient) -> None:
    headers = token_headers(client, "viewer", "short-lived")
    assert client.delete("/v1/tokens/short-lived").json()["revoked_at"] is not None
    assert client.get("/v1/deployments", headers=headers).status_code == 401


@pytest.mark.parametrize(
    ("role", "read", "scale", "configure"),
    [
        ("viewer", 200, 403, 403),
        ("autoscaler", 200, 404, 403),
        ("operator", 200, 404, 403),
        ("admin", 200, 404, 201),
    ],
)
def test_roles_grant_reads_scale_requests_and_configuration(
    client: TestClient, role: str, read: int, scale: int, configure: int
) -> None:
    headers = token_headers(client, role)
    assert client.get("/v1/reconfigurations", headers=headers).status_code == read
    # 404: allowed, and then the (missing) deployment is the problem
    scale_request = {"deployment": "missing", "target_dp_size": 2}
    assert client.post("/v1/reconfigurations", json=scale_request, headers=headers).status_code == scale
    assert client.post("/v1/deployments", json={"name": "x"}, headers=headers).status_code == configure


def test_forbidden_says_which_roles_would_do(client: TestClient) -> None:
    problem = client.post(
        "/v1/tokens", json={"name": "x", "role": "admin"}, headers=token_headers(client, "operator")
    ).json()
    assert problem["status"] == 403 and "admin" in problem["detail"]


def test_first_start_without_env_token_generates_one_admin_token_printed_once(
    database_url: str, tmp_path: object, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(database_url=database_url, admin_token=None)
    with TestClient(create_app(settings)):
        pass
    first = capfd.readouterr().err
    assert "created an admin token" in first
    secret = next(word for word in first.split() if word.startswith("epctl_"))
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {secret}"}) as client:
        assert client.get("/v1/tokens").status_code == 200
    assert "epctl_" not in capfd.readouterr().err


def test_the_last_live_admin_token_cannot_be_revoked(client: TestClient) -> None:
    refused = client.delete("/v1/tokens/admin-env")
    assert refused.status_code == 409 and refused.json()["code"] == "last-admin-token"
    assert refused.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/deployments").status_code == 200  # still in
    token_headers(client, "viewer", "not-an-admin")  # a live token of another role does not count
    assert client.delete("/v1/tokens/admin-env").status_code == 409
    second = token_headers(client, "admin", "second-admin")
    assert client.delete("/v1/tokens/admin-env").json()["revoked_at"] is not None
    refused = client.delete("/v1/tokens/second-admin", headers=second)
    assert refused.status_code == 409 and refused.json()["code"] == "last-admin-token"


def test_the_token_list_shows_at_most_four_characters_of_a_secret(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    env_secret = "0123456789abcdef"  # as short as allowed (16)
    settings = Settings(
        database_url=database_url, data_dir=tmp_path / "d", admin_token=env_secret, auto_migrate=False
    )
    with TestClient(create_app(settings)) as client:
        headers = {"Authorization": f"Bearer {env_secret}"}
        created = client.post("/v1/tokens", json={"name": "ci", "role": "viewer"}, headers=headers).json()
        shown = {
            t["name"]: t["token_prefix"] for t in client.get("/v1/tokens", headers=headers).json()["data"]
        }
    assert shown["admin-env"] == "0123"
    assert shown["ci"] == created["token_prefix"] == created["token"][: len("epctl_") + 4]


def test_guessing_tokens_is_throttled_per_client_and_a_proven_token_keeps_working(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """After a few failures a client is answered 429 with Retry-After, before its token is looked up;
    the admin token that already worked from that client keeps working there; a few log lines."""
    assert client.get("/v1/deployments").status_code == 200  # the admin token, proven from here
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="app.auth"):
        answers = [
            client.get("/v1/deployments", headers={"Authorization": f"Bearer epctl_guess{i:04d}"})
            for i in range(200)
        ]
    elapsed = time.monotonic() - started
    statuses = [a.status_code for a in answers]
    # The burst, then one more failure per second at most (counted against the clock).
    assert statuses[:10] == [401] * 10 and statuses.count(401) <= 10 + int(elapsed) + 1, (statuses, elapsed)
    throttled = next(a for a in answers if a.status_code == 429)
    assert throttled.json()["code"] == "too-many-failed-attempts"
    assert int(throttled.headers["retry-after"]) >= 1
    assert len([r for r in caplog.records if r.name == "app.auth"]) <= 3
    assert client.get("/v1/deployments").status_code == 200
    viewer = token_headers(client, "viewer")  # never used from here: it waits its turn like a guess
    # Who waits is not a matter of time: the throttle's clock stops here (on a loaded machine a second
    # passed since the last guess and refilled one failure), and one more guess spends what is left.
    throttle = client.app.state.auth_guard.throttle  # type: ignore[attr-defined]
    stopped = throttle.clock()
    throttle.clock = lambda: stopped
    for _ in range(3):
        client.get("/v1/deployments", headers={"Authorization": "Bearer epctl_guess_again"})
    assert client.get("/v1/deployments", headers=viewer).status_code == 429
    assert client.get("/v1/deployments").status_code == 200  # the proven admin token still works
