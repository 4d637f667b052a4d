"""Each deployment's agent key: made at creation, sealed at rest, shown once (admin), rotated with an
overlap; what the coordinator sends to the agents (`agent_keys_of`) follows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.core.clock import utc_now
from app.core.sealing import SECRET_KEY_ENV
from app.deployments.agent_keys import agent_keys_of, previous_until_epoch
from app.deployments.models import Deployment
from tests.support.fixtures import token_headers

DEMO = {"name": "demo", "min_dp_size": 1, "max_dp_size": 4, "launcher": "static"}


def stored(session: Session, name: str = "demo") -> Deployment:
    session.expire_all()
    row = session.exec(select(Deployment).where(Deployment.name == name)).one()
    return row


def test_a_key_is_made_at_creation_sealed_and_shown_once_to_an_admin_only(
    client: TestClient, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_KEY_ENV, Fernet.generate_key().decode())
    created = client.post("/v1/deployments", json=DEMO)
    assert created.status_code == 201 and "agent_key" not in created.text and "epak_" not in created.text
    operator = token_headers(client, "operator")
    refused = client.post("/v1/deployments/demo/agent-key", headers=operator)
    assert refused.status_code == 403
    shown = client.post("/v1/deployments/demo/agent-key")
    assert shown.status_code == 200, shown.text
    key = shown.json()["key"]
    assert key.startswith("epak_") and len(key) >= 40
    row = stored(session)
    assert row.agent_key is not None and row.agent_key.startswith("fernet:") and key not in row.agent_key
    assert agent_keys_of(row) == (key,)
    again = client.post("/v1/deployments/demo/agent-key")
    assert again.status_code == 409 and again.json()["code"] == "agent-key-already-shown"
    assert key not in again.text
    listing = client.get("/v1/deployments/demo").text + client.get("/v1/deployments").text
    assert key not in listing


def test_a_rotation_sends_the_new_key_first_and_the_old_one_until_the_overlap_ends(
    client: TestClient, session: Session
) -> None:
    assert client.post("/v1/deployments", json=DEMO).status_code == 201
    old = client.post("/v1/deployments/demo/agent-key").json()["key"]
    rotated = client.post("/v1/deployments/demo/agent-key/rotate", json={"overlap_s": 600})
    assert rotated.status_code == 200, rotated.text
    body = rotated.json()
    new = body["key"]
    assert new != old and body["previous_valid_until"] is not None
    assert body["pushed_to"] == [] and body["not_pushed"] == {}  # no engine registered yet
    row = stored(session)
    assert agent_keys_of(row) == (new, old)
    assert agent_keys_of(row, now=utc_now() + timedelta(seconds=601)) == (new,)
    too_long = client.post("/v1/deployments/demo/agent-key/rotate", json={"overlap_s": 30 * 86400})
    assert too_long.status_code == 422 and agent_keys_of(stored(session)) == (new, old)


def test_an_operator_may_choose_the_key_for_static_agents(client: TestClient, session: Session) -> None:
    chosen = "epak_" + "k" * 40
    assert client.post("/v1/deployments", json={**DEMO, "agent_key": chosen}).status_code == 201
    assert agent_keys_of(stored(session)) == (chosen,)
    short = client.post("/v1/deployments", json={**DEMO, "name": "short", "agent_key": "x" * 8})
    assert short.status_code == 422


def test_a_second_rotation_inside_the_overlap_ends_the_first_previous_key_at_once(
    client: TestClient, session: Session
) -> None:
    """One previous key at most, always with an end: the coordinator sends (and launches engines with)
    the key it replaced last, until that one's own overlap ends; an overlap has a minimum."""
    assert client.post("/v1/deployments", json=DEMO).status_code == 201
    first = client.post("/v1/deployments/demo/agent-key").json()["key"]
    assert client.post("/v1/deployments/demo/agent-key/rotate", json={"overlap_s": 5}).status_code == 422
    second = client.post("/v1/deployments/demo/agent-key/rotate", json={"overlap_s": 3600}).json()
    third = client.post("/v1/deployments/demo/agent-key/rotate", json={"overlap_s": 60}).json()
    row = stored(session)
    assert agent_keys_of(row) == (third["key"], second["key"]) and first not in agent_keys_of(row)
    ends = previous_until_epoch(row)
    assert ends is not None and abs(ends - (utc_now() + timedelta(seconds=60)).timestamp()) < 5
    assert agent_keys_of(row, now=utc_now() + timedelta(seconds=61)) == (third["key"],)
    assert previous_until_epoch(row, now=utc_now() + timedelta(seconds=61)) is None
