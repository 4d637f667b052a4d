"""`retire` on a scale-down request: the operator names the engines that leave. Every bad list is a
422 problem and creates nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment


@pytest.fixture
def serving_three(client: TestClient, db_engine: DbEngine) -> list[str]:
    """Deployment `demo` serving generation 1 on three engines (ranks 0..2), one more engine idle."""
    body = {"name": "demo", "min_dp_size": 1, "max_dp_size": 4, "launcher": "static"}
    assert client.post("/v1/deployments", json=body).status_code == 201
    ids = [f"demo-{i}" for i in range(4)]
    for index, engine_id in enumerate(ids):
        registration = {
            "engine_id": engine_id,
            "deployment": "demo",
            "url": f"http://h:{index}",
            "platform": "cpu",
            "device": "cpu",
            "engine": {},
        }
        assert client.post("/v1/engines", json=registration).status_code == 201
    with Session(db_engine) as session:
        deployment = session.exec(select(Deployment).where(Deployment.name == "demo")).one()
        deployment.current_dp_size, deployment.generation = 3, 1
        for rank, engine_id in enumerate(ids[:3]):
            row = session.get(Engine, engine_id)
            assert row is not None
            row.dp_rank, row.generation, row.world_size = rank, 1, 3
            row.state = EngineState.serving.value
        session.commit()
    return ids


def _scale(client: TestClient, target: int, **fields: Any) -> Any:
    body = {"deployment": "demo", "target_dp_size": target, **fields}
    return client.post("/v1/reconfigurations", json=body)


def _job_count(client: TestClient) -> int:
    return int(client.get("/v1/reconfigurations").json()["count"])


def test_a_scale_down_may_name_its_leaver_and_the_job_keeps_it(
    client: TestClient, serving_three: list[str]
) -> None:
    response = _scale(client, 2, retire=["demo-1"])
    assert response.status_code == 202, response.text
    job = client.get(response.headers["location"]).json()
    assert job["retire"] == ["demo-1"] and job["placement"] is None  # the plan fills the placement


@pytest.mark.parametrize(
    ("target", "retire", "code"),
    [
        (4, ["demo-1"], "retire-on-scale-up"),
        (1, ["demo-1", "demo-1"], "retire-duplicates"),
        (2, ["demo-3"], "retire-not-member"),  # registered, but idle
        (2, ["nobody"], "retire-not-member"),
        (1, ["demo-0", "demo-1", "demo-2"], "retire-everyone"),
        (1, ["demo-1"], "retire-count-mismatch"),
    ],
)
def test_a_bad_retire_list_is_a_422_problem_and_creates_nothing(
    client: TestClient, serving_three: list[str], target: int, retire: list[str], code: str
) -> None:
    response = _scale(client, target, retire=retire)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == code
    assert _job_count(client) == 0


def test_a_retire_entry_that_is_not_an_engine_id_is_refused_by_the_schema(
    client: TestClient, serving_three: list[str]
) -> None:
    response = _scale(client, 2, retire=["../etc"])
    assert response.status_code == 422
    assert _job_count(client) == 0
