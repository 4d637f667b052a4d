"""`GET /v1/deployments/{name}/endpoints` and its long-poll watch."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.api.database import Database
from app.core.config import Settings
from app.deployments.engines.models import Engine
from app.deployments.front_door import FrontDoor
from app.deployments.models import Deployment
from app.frontdoor.keeper import publish_feeds
from app.frontdoor.models import EndpointSetVersion
from app.frontdoor.service import latest, refresh, refresh_all, set_front_door
from app.jobs.models import ReconfigurationJob
from app.main import create_app
from tests.support.factories import set_row, static_deployment
from tests.support.fixtures import ADMIN_HEADERS, token_headers


def _serving(db_engine: DbEngine, name: str = "fd", size: int = 2) -> Deployment:
    """A static deployment whose engines serve generation 1, ranks 0..size-1."""
    with Session(db_engine, expire_on_commit=False) as session:
        deployment = static_deployment(session, name, engines=size)
        deployment.generation, deployment.current_dp_size = 1, size
        session.add(deployment)
        for rank, row in enumerate(
            session.exec(select(Engine).where(Engine.deployment_id == deployment.id)).all()
        ):
            row.state, row.dp_rank, row.generation = "serving", rank, 1
            session.add(row)
        session.commit()
        return deployment


def _set_engine(db_engine: DbEngine, engine_id: str, **fields: Any) -> None:
    set_row(db_engine, Engine, engine_id, **fields)


def _states(body: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {e["engine_id"]: (e["state"], e["reason"]) for e in body["endpoints"]}


def test_the_feed_lists_each_engine_with_address_rank_and_state(
    client: TestClient, db_engine: DbEngine
) -> None:
    _serving(db_engine)
    response = client.get("/v1/deployments/fd/endpoints")
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["deployment"], body["generation"], body["resourceVersion"]) == ("fd", 1, 1)
    assert [(e["engine_id"], e["address"], e["dp_rank"], e["state"]) for e in body["endpoints"]] == [
        ("fd-engine-0", "http://127.0.0.1:9000", 0, "ready"),
        ("fd-engine-1", "http://127.0.0.1:9001", 1, "ready"),
    ]
    assert body["front_door"] is None


def test_reading_again_without_a_change_keeps_the_version(client: TestClient, db_engine: DbEngine) -> None:
    _serving(db_engine)
    first = client.get("/v1/deployments/fd/endpoints").json()["resourceVersion"]
    assert client.get("/v1/deployments/fd/endpoints").json()["resourceVersion"] == first


def test_a_fenced_engine_is_out_in_the_next_version(client: TestClient, db_engine: DbEngine) -> None:
    _serving(db_engine)
    client.get("/v1/deployments/fd/endpoints")
    _set_engine(db_engine, "fd-engine-1", state="fenced")
    body = client.get("/v1/deployments/fd/endpoints").json()
    assert body["resourceVersion"] == 2
    assert _states(body)["fd-engine-1"] == ("out", "fenced")


def test_a_leaver_of_the_active_job_is_draining_and_back_when_the_job_rolls_back(
    client: TestClient, db_engine: DbEngine
) -> None:
    deployment = _serving(db_engine)
    response = client.post("/v1/reconfigurations", json={"deployment": "fd", "target_dp_size": 1})
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    with Session(db_engine) as session:  # the plan, as the runner writes it before prepare
        job = session.get(ReconfigurationJob, job_id)
        assert job is not None and job.deployment_id == deployment.id
        job.state = "preparing"
        job.engine_results = [
            {"engine_id": "fd-engine-0", "role": "staying"},
            {"engine_id": "fd-engine-1", "role": "leaving"},
        ]
        session.add(job)
        session.commit()
    body = client.get("/v1/deployments/fd/endpoints").json()
    assert _states(body)["fd-engine-1"] == ("draining", f"leaving in job {job_id}")
    assert body["job_id"] == job_id
    with Session(db_engine) as session:
        job = session.get(ReconfigurationJob, job_id)
        assert job is not None
        job.state = "rolled_back"
        session.add(job)
        session.commit()
    assert _states(client.get("/v1/deployments/fd/endpoints").json())["fd-engine-1"] == ("ready", None)


def test_a_watch_answers_with_the_next_version_once_there_is_one(
    client: TestClient, db_engine: DbEngine
) -> None:
    _serving(db_engine)
    version = client.get("/v1/deployments/fd/endpoints").json()["resourceVersion"]
    answers: list[dict[str, Any]] = []

    def watch() -> None:
        answers.append(
            client.get(
                "/v1/deployments/fd/endpoints",
                params={"watch": "true", "resourceVersion": version, "timeoutSeconds": 60},
            ).json()
        )

    watcher = threading.Thread(target=watch)
    watcher.start()
    _set_engine(db_engine, "fd-engine-0", state="unreachable")
    watcher.join(timeout=60)
    assert answers and answers[0]["resourceVersion"] == version + 1
    assert _states(answers[0])["fd-engine-0"] == ("out", "unreachable")


def test_a_watch_from_an_old_version_sees_every_change_once_in_order(
    client: TestClient, db_engine: DbEngine
) -> None:
    _serving(db_engine)
    client.get("/v1/deployments/fd/endpoints")
    _set_engine(db_engine, "fd-engine-0", state="fenced")
    client.get("/v1/deployments/fd/endpoints")
    _set_engine(db_engine, "fd-engine-0", state="serving")
    client.get("/v1/deployments/fd/endpoints")
    seen, version = [], 0
    for _ in range(3):
        body = client.get(
            "/v1/deployments/fd/endpoints", params={"watch": "true", "resourceVersion": version}
        ).json()
        version = body["resourceVersion"]
        seen.append((version, _states(body)["fd-engine-0"][0]))
    assert seen == [(1, "ready"), (2, "out"), (3, "ready")]


def test_a_watch_with_nothing_new_answers_the_same_version_at_its_timeout(
    client: TestClient, db_engine: DbEngine
) -> None:
    _serving(db_engine)
    version = client.get("/v1/deployments/fd/endpoints").json()["resourceVersion"]
    body = client.get(
        "/v1/deployments/fd/endpoints",
        params={"watch": "true", "resourceVersion": version, "timeoutSeconds": 0.3},
    ).json()
    assert body["resourceVersion"] == version


def test_a_watch_from_a_version_ahead_of_the_newest_is_a_422_at_once(
    client: TestClient, db_engine: DbEngine
) -> None:
    _serving(db_engine)
    version = client.get("/v1/deployments/fd/endpoints").json()["resourceVersion"]
    for ahead in (version + 1, 2**63 - 1):  # the largest one is past Postgres' integer column, too
        response = client.get(
            "/v1/deployments/fd/endpoints",
            params={"watch": "true", "resourceVersion": ahead, "timeoutSeconds": 300},
        )
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "resource-version-ahead"


def test_the_coordinator_caps_how_long_a_watch_waits(
    client: TestClient, db_engine: DbEngine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _serving(db_engine)
    version = client.get("/v1/deployments/fd/endpoints").json()["resourceVersion"]
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    capped = create_app(
        settings.model_copy(update={"webhook_worker_enabled": False, "endpoints_watch_max_s": 0.2})
    )
    answers: list[dict[str, Any]] = []
    with TestClient(capped, headers=ADMIN_HEADERS) as again:
        # Asked for 300 s with nothing new: the cap ends it with the same version. Were it the ask that
        # ended it, the call would still be waiting when the minute given here is over.
        asking = threading.Thread(
            target=lambda: answers.append(
                again.get(
                    "/v1/deployments/fd/endpoints",
                    params={"watch": "true", "resourceVersion": version, "timeoutSeconds": 300},
                ).json()
            ),
            daemon=True,
        )
        asking.start()
        asking.join(timeout=60)
        assert not asking.is_alive(), "the watch waited past the coordinator's cap"
    assert [body["resourceVersion"] for body in answers] == [version]


def test_a_viewer_may_read_the_feed(client: TestClient, db_engine: DbEngine) -> None:
    _serving(db_engine)
    viewer = token_headers(client, "viewer")
    assert client.get("/v1/deployments/fd/endpoints", headers=viewer).status_code == 200


def test_the_feed_needs_a_token(client: TestClient, db_engine: DbEngine) -> None:
    _serving(db_engine)
    response = client.get("/v1/deployments/fd/endpoints", headers={"Authorization": ""})
    assert response.status_code == 401


def test_an_unknown_deployment_is_a_404_problem(client: TestClient) -> None:
    response = client.get("/v1/deployments/nope/endpoints")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "deployment-not-found"


def test_a_watch_resumes_from_its_resource_version_on_a_restarted_coordinator(
    client: TestClient, db_engine: DbEngine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _serving(db_engine)
    held = client.get("/v1/deployments/fd/endpoints").json()["resourceVersion"]
    _set_engine(db_engine, "fd-engine-1", state="fenced")
    client.get("/v1/deployments/fd/endpoints")
    _set_engine(db_engine, "fd-engine-1", state="serving")
    client.get("/v1/deployments/fd/endpoints")
    # Another coordinator process on the same database (the first one is gone): the versions are rows.
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    restarted = create_app(settings.model_copy(update={"webhook_worker_enabled": False}))
    with TestClient(restarted, headers=ADMIN_HEADERS) as again:
        seen = []
        for _ in range(2):
            body = again.get(
                "/v1/deployments/fd/endpoints", params={"watch": "true", "resourceVersion": held}
            ).json()
            held = body["resourceVersion"]
            seen.append(_states(body)["fd-engine-1"][0])
    assert seen == ["out", "ready"]


@pytest.mark.databases("sqlite", "postgres")
def test_one_publishing_pass_brings_every_deployment_up_to_date_and_writes_only_changes(
    db_engine: DbEngine,
) -> None:
    """`refresh_all` reads every deployment at once: each gets the version `refresh` alone would give
    it, a pass over an unchanged record writes nothing, and one engine's change writes one version."""
    deployments = [_serving(db_engine, name) for name in ("fa", "fb", "fc")]
    with Session(db_engine, expire_on_commit=False) as session:
        first = refresh_all(session)
        assert sorted(d for d, _ in first) == sorted(d.id for d in deployments)
        assert refresh_all(session) == []
        for deployment in deployments:
            alone, changed = refresh(session, deployment)
            assert not changed and alone.resource_version == 1
    _set_engine(db_engine, "fb-engine-1", state="unreachable")
    with Session(db_engine, expire_on_commit=False) as session:
        written = refresh_all(session)
        assert [(d, v.resource_version) for d, v in written] == [(deployments[1].id, 2)]
        states = {e["engine_id"]: e["state"] for e in written[0][1].endpoints}
        assert states == {"fb-engine-0": "ready", "fb-engine-1": "out"}
        assert refresh_all(session) == []


def test_a_pass_over_a_steady_fleet_derives_nothing_and_reads_no_stored_rank_set(db_engine: DbEngine) -> None:
    """With the publisher's memo (issue 37: 128 deployments, 4 passes a second), a deployment whose facts
    and newest version are those of the last pass is neither derived nor its stored endpoints read; a
    change of one engine is still written at the next pass."""
    deployments = [_serving(db_engine, name) for name in ("fa", "fb", "fc")]
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    memo: dict[str, Any] = {}
    with Session(db_engine, expire_on_commit=False) as session:
        assert len(refresh_all(session, memo)) == 3
    sa.event.listen(db_engine, "before_cursor_execute", seen)
    try:
        with Session(db_engine, expire_on_commit=False) as session:
            assert refresh_all(session, memo) == []
        assert not [s for s in statements if "endpoints" in s.split("FROM")[0]]  # before: every deployment's
        # Nor any deployment loaded as an object (its JSON columns decoded): their ids and generations.
        assert not [s for s in statements if "deployments.engine_config" in s]
    finally:
        sa.event.remove(db_engine, "before_cursor_execute", seen)
    _set_engine(db_engine, "fb-engine-1", state="unreachable")
    with Session(db_engine, expire_on_commit=False) as session:
        written = refresh_all(session, memo)
        assert [(d, v.resource_version) for d, v in written] == [(deployments[1].id, 2)]
        assert refresh_all(session, memo) == []


def test_the_publisher_writes_each_change_of_the_record_without_any_reader(db_engine: DbEngine) -> None:
    deployment = _serving(db_engine)

    def latest_version() -> EndpointSetVersion | None:
        with Session(db_engine) as session:
            return latest(session, deployment.id)

    async def run() -> list[str]:
        publisher = asyncio.create_task(publish_feeds(Database(db_engine, concurrency=2), interval_s=0.02))
        try:
            first = await _until(latest_version)
            _set_engine(db_engine, "fd-engine-0", state="unreachable")
            second = await _until(
                lambda: (
                    (v := latest_version()) is not None and v.resource_version > first.resource_version and v
                )
            )
            return [e["state"] for e in second.endpoints if e["engine_id"] == "fd-engine-0"]
        finally:
            publisher.cancel()

    assert asyncio.run(run()) == ["out"]


async def _until(check: Any) -> Any:
    async with asyncio.timeout(30):
        while not (found := check()):
            await asyncio.sleep(0.01)
        return found


def test_deleting_a_deployment_deletes_its_feed_and_front_door(
    client: TestClient, db_engine: DbEngine
) -> None:
    deployment = _serving(db_engine)
    client.get("/v1/deployments/fd/endpoints")
    with Session(db_engine) as session:
        set_front_door(session, ref="fd", url="http://127.0.0.1:1", keeper="test")
    assert client.delete("/v1/deployments/fd").status_code == 204
    with Session(db_engine) as session:
        assert latest(session, deployment.id) is None
        assert session.get(FrontDoor, deployment.id) is None
