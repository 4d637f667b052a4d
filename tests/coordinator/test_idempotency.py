"""`Idempotency-Key` on `POST /v1/reconfigurations`."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.jobs.models import IdempotencyRecord
from app.tokens.models import ApiToken

# Idempotency keys are claimed by unique rows: the database decides.
pytestmark = pytest.mark.databases("sqlite", "postgres")

BODY = {"deployment": "demo", "target_dp_size": 3}


def _deployment(client: TestClient) -> None:
    assert client.post("/v1/deployments", json={"name": "demo", "max_dp_size": 4}).status_code == 201


def _post(client: TestClient, key: str, body: dict[str, object] = BODY):  # type: ignore[no-untyped-def]
    return client.post("/v1/reconfigurations", json=body, headers={"Idempotency-Key": key})


def test_the_same_key_and_body_return_the_same_job(client: TestClient) -> None:
    _deployment(client)
    first = _post(client, "k1")
    again = _post(client, "k1")
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true"
    assert client.get("/v1/reconfigurations").json()["count"] == 1


def test_the_same_key_with_another_body_is_422(client: TestClient) -> None:
    _deployment(client)
    _post(client, "k1")
    response = _post(client, "k1", {"deployment": "demo", "target_dp_size": 2})
    assert response.status_code == 422 and response.json()["code"] == "idempotency-key-reused"


def test_a_retry_while_the_first_is_in_flight_is_409(client: TestClient, db_engine: Engine) -> None:
    _deployment(client)
    # The first request has claimed the key and not finished yet (as seen by a concurrent retry).
    _post(client, "k1")
    with Session(db_engine) as session:
        record = session.exec(select(IdempotencyRecord).where(IdempotencyRecord.key == "k1")).one()
        record.state, record.job_id = "in_flight", None
        session.commit()
    response = _post(client, "k1")
    assert response.status_code == 409 and response.json()["code"] == "idempotency-key-in-flight"


def test_a_refused_request_leaves_its_key_free(client: TestClient) -> None:
    response = _post(client, "k1")  # no deployment yet: 404
    assert response.status_code == 404
    _deployment(client)
    assert _post(client, "k1").status_code == 202


def test_keys_are_scoped_to_the_token(client: TestClient, db_engine: Engine) -> None:
    _deployment(client)
    _post(client, "k1")
    with Session(db_engine) as session:
        record = session.exec(select(IdempotencyRecord)).one()
        token = session.exec(select(ApiToken).where(ApiToken.id == record.scope)).one()
    assert token.role == "admin"


@pytest.mark.parametrize("key", ["", " ", "\t"])
def test_an_empty_key_is_422_problem_and_makes_no_job(client: TestClient, key: str) -> None:
    _deployment(client)
    for send in (
        lambda: _post(client, key),
        lambda: client.put(
            "/v1/deployments/demo/scale",
            json={"spec": {"replicas": 3}},
            headers={"Idempotency-Key": key},
        ),
    ):
        response = send()
        assert response.status_code == 422, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "validation-error"
    assert client.get("/v1/reconfigurations").json()["count"] == 0
