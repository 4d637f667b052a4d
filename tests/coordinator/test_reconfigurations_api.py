"""`/v1/reconfigurations`: validated creation, one active job per deployment, history, cancel."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.deployments.models import Deployment
from app.jobs.states import JobState
from app.jobs.transitions import transition
from tests.support.fixtures import token_headers

S = JobState


def _deployment(client: TestClient, name: str = "demo", **fields: Any) -> None:
    body = {"name": name, "min_dp_size": 1, "max_dp_size": 4, **fields}
    assert client.post("/v1/deployments", json=body).status_code == 201


def _register(client: TestClient, count: int, deployment: str = "demo") -> None:
    for index in range(count):
        body = {
            "engine_id": f"{deployment}-{index}",
            "deployment": deployment,
            "url": f"http://h:{index}",
            "platform": "cpu",
            "device": "cpu",
            "engine": {},
        }
        assert client.post("/v1/engines", json=body).status_code == 201


def _scale(client: TestClient, target: int, deployment: str = "demo", **fields: Any) -> Any:
    return client.post(
        "/v1/reconfigurations", json={"deployment": deployment, "target_dp_size": target, **fields}
    )


def _job_count(client: TestClient) -> int:
    return int(client.get("/v1/reconfigurations").json()["count"])


def _set_size(db_engine: Engine, name: str, size: int) -> None:
    with Session(db_engine) as session:
        deployment = session.exec(select(Deployment).where(Deployment.name == name)).one()
        deployment.current_dp_size = size
        session.commit()


def test_create_answers_202_with_location_and_a_pending_job(client: TestClient) -> None:
    _deployment(client)
    response = _scale(client, 3, reason="more traffic")
    assert response.status_code == 202
    job = response.json()
    assert response.headers["location"] == f"/v1/reconfigurations/{job['id']}"
    assert job["id"].startswith("rcfg_") and len(job["id"]) == 31
    assert (job["state"], job["from_dp_size"], job["to_dp_size"]) == ("pending", 0, 3)
    assert (job["from_generation"], job["to_generation"], job["requested_by"]) == (0, 1, "api")
    assert (job["reason"], job["warmup_policy_requested"], job["warmup_policy"]) == (
        "more traffic",
        "auto",
        None,
    )


def test_get_shows_the_job_with_its_transition_log(client: TestClient) -> None:
    _deployment(client)
    job = _scale(client, 2).json()
    detail = client.get(f"/v1/reconfigurations/{job['id']}").json()
    assert [(e["seq"], e["kind"], e["to_state"]) for e in detail["events"]] == [(1, "created", "pending")]
    assert detail["progress"] == {"step": None, "percent": 0.0} and detail["cleanup_state"] == "none"


def test_a_second_request_gets_409_naming_the_active_job(client: TestClient) -> None:
    _deployment(client)
    first = _scale(client, 3).json()
    response = _scale(client, 2)
    assert response.status_code == 409
    problem = response.json()
    assert response.headers["content-type"] == "application/problem+json"
    assert problem["code"] == "active-job-exists" and problem["active_job_id"] == first["id"]
    assert first["id"] in problem["detail"]
    assert _job_count(client) == 1


def test_a_finished_job_frees_the_deployment(client: TestClient, db_engine: Engine) -> None:
    _deployment(client)
    first = _scale(client, 3).json()
    with Session(db_engine) as session:
        transition(session, job_id=first["id"], from_state=S.pending, to_state=S.failed)
    assert _scale(client, 2).status_code == 202


@pytest.mark.parametrize("target", [0, 5])
def test_targets_outside_the_limits_are_refused_and_nothing_is_written(
    client: TestClient, target: int
) -> None:
    _deployment(client)
    response = _scale(client, target)
    assert response.status_code == 422 and response.headers["content-type"] == "application/problem+json"
    assert _job_count(client) == 0


def test_a_target_equal_to_the_current_size_is_refused(client: TestClient, db_engine: Engine) -> None:
    _deployment(client)
    _set_size(db_engine, "demo", 2)
    response = _scale(client, 2)
    assert response.status_code == 409 and response.json()["code"] == "already-at-target"
    assert _job_count(client) == 0


def test_a_degraded_deployment_may_be_re_formed_at_its_size(client: TestClient, db_engine: Engine) -> None:
    """Its group broke: a new generation at the same size (on the engines there are, or fresh ones)."""
    _deployment(client)
    _set_size(db_engine, "demo", 2)
    with Session(db_engine) as session:
        deployment = session.exec(select(Deployment).where(Deployment.name == "demo")).one()
        deployment.status = "degraded"
        session.commit()
    response = _scale(client, 2)
    assert response.status_code == 202, response.text
    assert (response.json()["from_dp_size"], response.json()["to_dp_size"]) == (2, 2)


def test_static_launch_needs_enough_known_engines(client: TestClient) -> None:
    """All or nothing: every engine known; a partial grow (the default): one more than the current."""
    _deployment(client, launcher="static")
    _register(client, 2)
    response = _scale(client, 3, all_or_nothing=True)
    assert response.status_code == 409 and response.json()["code"] == "not-enough-engines"
    assert response.json()["known_engines"] == 2
    partial = _scale(client, 3)
    assert partial.status_code == 202, partial.text
    assert (partial.json()["to_dp_size"], partial.json()["all_or_nothing"]) == (3, False)


def test_engines_that_left_do_not_count(client: TestClient) -> None:
    _deployment(client, launcher="static")
    _register(client, 2)
    client.delete("/v1/engines/demo-1")
    assert _scale(client, 2, all_or_nothing=True).json()["code"] == "not-enough-engines"


def test_an_unknown_deployment_is_404(client: TestClient) -> None:
    response = _scale(client, 2, deployment="nope")
    assert response.status_code == 404 and response.json()["code"] == "deployment-not-found"


@pytest.mark.parametrize("body", [b"garbage", b"{}", b'{"deployment": "demo", "target_dp_size": "many"}'])
def test_malformed_bodies_are_422_problems(client: TestClient, body: bytes) -> None:
    _deployment(client)
    response = client.post("/v1/reconfigurations", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    problem = response.json()
    assert problem["code"] == "validation-error" and problem["errors"] and problem["status"] == 422
    assert _job_count(client) == 0


def test_an_unresolved_cleanup_failure_blocks_the_next_job(client: TestClient, db_engine: Engine) -> None:
    _deployment(client)
    first = _scale(client, 2).json()
    with Session(db_engine) as session:
        for before, after in [
            (S.pending, S.preparing),
            (S.preparing, S.syncing),
            (S.syncing, S.committing),
            (S.committing, S.cleaning_up),
        ]:
            transition(session, job_id=first["id"], from_state=before, to_state=after)
        transition(
            session,
            job_id=first["id"],
            from_state=S.cleaning_up,
            to_state=S.succeeded,
            changes={"cleanup_state": "failed"},
        )
    response = _scale(client, 3)
    assert response.status_code == 409 and response.json()["failed_job_id"] == first["id"]


def test_autoscaler_tokens_are_recorded_as_the_autoscaler(client: TestClient) -> None:
    _deployment(client)
    response = client.post(
        "/v1/reconfigurations",
        json={"deployment": "demo", "target_dp_size": 2},
        headers=token_headers(client, "autoscaler", "hpa"),
    )
    assert response.status_code == 202
    assert (response.json()["requested_by"], response.json()["requester"]) == ("autoscaler", "hpa")


def test_the_cli_may_say_it_is_the_cli(client: TestClient) -> None:
    _deployment(client)
    assert _scale(client, 2, source="cli").json()["requested_by"] == "cli"


def test_viewers_cannot_scale(client: TestClient) -> None:
    _deployment(client)
    response = client.post(
        "/v1/reconfigurations",
        json={"deployment": "demo", "target_dp_size": 2},
        headers=token_headers(client, "viewer"),
    )
    assert response.status_code == 403 and response.json()["code"] == "forbidden"


def test_an_unknown_job_is_404(client: TestClient) -> None:
    response = client.get("/v1/reconfigurations/rcfg_nope")
    assert response.status_code == 404 and response.json()["code"] == "job-not-found"


# --- history -------------------------------------------------------------------------------------------


def _history(client: TestClient, db_engine: Engine, count: int) -> list[str]:
    """`count` finished jobs on deployment `demo`, oldest first."""
    ids = []
    for index in range(count):
        job = _scale(client, 2 + index % 2).json()
        with Session(db_engine) as session:
            transition(session, job_id=job["id"], from_state=S.pending, to_state=S.cancelled)
        ids.append(job["id"])
    return ids


@pytest.mark.databases("sqlite", "postgres")
def test_list_pages_newest_first_with_a_cursor(client: TestClient, db_engine: Engine) -> None:
    _deployment(client)
    ids = _history(client, db_engine, 5)
    seen, cursor, pages = [], None, 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/reconfigurations", params=params).json()
        assert page["count"] == 5
        seen += [job["id"] for job in page["data"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1] and pages == 3


@pytest.mark.databases("sqlite", "postgres")
def test_list_filters_by_deployment_state_source_and_time(client: TestClient, db_engine: Engine) -> None:
    _deployment(client)
    _deployment(client, "other")
    finished = _history(client, db_engine, 2)
    active = _scale(client, 2, deployment="other", source="cli").json()

    def ids(**params: Any) -> list[str]:
        return [job["id"] for job in client.get("/v1/reconfigurations", params=params).json()["data"]]

    assert ids(deployment="other") == [active["id"]]
    assert ids(state="cancelled") == finished[::-1]
    assert ids(source="cli") == [active["id"]]
    assert ids(created_after=active["created_at"]) == [active["id"]]
    assert active["id"] not in ids(created_before=active["created_at"])


def test_a_malformed_cursor_is_a_problem(client: TestClient) -> None:
    response = client.get("/v1/reconfigurations", params={"cursor": "!!!"})
    assert response.status_code == 422 and response.json()["code"] == "invalid-cursor"


def test_list_limit_is_capped(client: TestClient) -> None:
    assert client.get("/v1/reconfigurations", params={"limit": 201}).status_code == 422


# --- cancel --------------------------------------------------------------------------------------------


def test_cancelling_a_pending_job_cancels_it_at_once(client: TestClient) -> None:
    _deployment(client)
    job = _scale(client, 2).json()
    response = client.post(f"/v1/reconfigurations/{job['id']}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert _scale(client, 3).status_code == 202


@pytest.mark.parametrize("path", [[S.preparing], [S.preparing, S.syncing]])
def test_cancelling_before_commit_asks_the_runner(
    client: TestClient, db_engine: Engine, path: list[JobState]
) -> None:
    _deployment(client)
    job = _scale(client, 2).json()
    with Session(db_engine) as session:
        for before, after in zip([S.pending, *path], path, strict=False):
            transition(session, job_id=job["id"], from_state=before, to_state=after)
    response = client.post(f"/v1/reconfigurations/{job['id']}/cancel")
    assert response.status_code == 202
    assert response.json()["cancel_requested"] is True and response.json()["state"] == path[-1]
    events = client.get(f"/v1/reconfigurations/{job['id']}").json()["events"]
    assert events[-1]["kind"] == "cancel_requested"


def test_cancelling_once_commit_started_is_409(client: TestClient, db_engine: Engine) -> None:
    _deployment(client)
    job = _scale(client, 2).json()
    with Session(db_engine) as session:
        for before, after in [(S.pending, S.preparing), (S.preparing, S.syncing), (S.syncing, S.committing)]:
            transition(session, job_id=job["id"], from_state=before, to_state=after)
    response = client.post(f"/v1/reconfigurations/{job['id']}/cancel")
    assert response.status_code == 409 and response.json()["code"] == "not-cancellable"


def test_viewers_cannot_cancel(client: TestClient) -> None:
    _deployment(client)
    job = _scale(client, 2).json()
    response = client.post(
        f"/v1/reconfigurations/{job['id']}/cancel", headers=token_headers(client, "viewer")
    )
    assert response.status_code == 403
