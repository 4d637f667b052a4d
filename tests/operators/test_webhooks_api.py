"""`/v1/webhooks`: subscriptions (secret shown once), the delivery log; and `/metrics`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app import metrics
from app.core.config import Settings
from app.webhooks.delivery import DeliveryPolicy, DeliveryWorker
from tests.operators import rows
from tests.operators.receiver import LOOPBACK, ScriptedResponse, WebhookReceiver, allowing_loopback
from tests.support.fixtures import token_headers

PROBLEM = "application/problem+json"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """This module subscribes a receiver on loopback through the API: allowed, as an operator would."""
    return allowing_loopback(settings)


@pytest.fixture(autouse=True)
def _no_background_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    monkeypatch.setenv("EPCTL_WEBHOOK_WORKER_ENABLED", "false")
    yield


def test_create_shows_the_secret_once(client: TestClient) -> None:
    created = client.post(
        "/v1/webhooks", json={"url": "https://hooks.example/epctl", "event_types": ["reconfiguration.failed"]}
    )
    assert created.status_code == 201
    body = created.json()
    assert body["secret"].startswith("whsec_") and body["active"] is True
    assert created.headers["location"] == f"/v1/webhooks/{body['id']}"
    assert "secret" not in client.get(f"/v1/webhooks/{body['id']}").json()
    assert all("secret" not in s for s in client.get("/v1/webhooks").json()["data"])


def test_rotating_the_secret_shows_a_new_one_once(client: TestClient) -> None:
    created = client.post("/v1/webhooks", json={"url": "http://127.0.0.1:1/x"}).json()
    rotated = client.post(f"/v1/webhooks/{created['id']}/rotate-secret").json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != created["secret"]


@pytest.mark.parametrize(
    "body",
    [
        {"url": "ftp://x/y"},
        {"url": "not a url"},
        {"url": "http://h/x", "event_types": ["reconfiguration.exploded"]},
        {"event_types": []},
    ],
)
def test_invalid_subscription_is_422_problem(client: TestClient, body: dict[str, object]) -> None:
    response = client.post("/v1/webhooks", json=body)
    assert response.status_code == 422 and response.headers["content-type"].startswith(PROBLEM)
    assert client.get("/v1/webhooks").json()["count"] == 0


def test_only_admins_change_subscriptions_and_viewers_read_them(client: TestClient) -> None:
    operator = token_headers(client, "operator")
    viewer = token_headers(client, "viewer")
    assert client.post("/v1/webhooks", json={"url": "http://h/x"}, headers=operator).status_code == 403
    assert client.get("/v1/webhooks", headers=viewer).status_code == 200


def test_update_and_delete(client: TestClient) -> None:
    created = client.post("/v1/webhooks", json={"url": "http://h/x"}).json()
    updated = client.patch(f"/v1/webhooks/{created['id']}", json={"active": False, "description": "paused"})
    assert (updated.json()["active"], updated.json()["description"]) == (False, "paused")
    assert client.delete(f"/v1/webhooks/{created['id']}").status_code == 204
    missing = client.get(f"/v1/webhooks/{created['id']}")
    assert missing.status_code == 404 and missing.json()["code"] == "webhook-not-found"


def test_delivery_log_shows_every_attempt_through_the_api(
    client: TestClient, session: Session, db_engine: Engine
) -> None:
    with WebhookReceiver().running() as receiver:
        created = client.post(
            "/v1/webhooks", json={"url": receiver.url, "event_types": ["reconfiguration.started"]}
        ).json()
        receiver.secret = created["secret"]
        receiver.respond(ScriptedResponse(503), ScriptedResponse(500))
        job = rows.make_job(session, rows.make_deployment(session, "d1").id)
        rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
        worker = DeliveryWorker(
            db_engine, DeliveryPolicy(retry_base_s=0.01, retry_max_s=0.01, allow_networks=LOOPBACK)
        )

        async def three_attempts() -> None:
            for _ in range(3):
                await worker.run_once()
                await asyncio.sleep(0.02)

        asyncio.run(three_attempts())
    log = client.get(f"/v1/webhooks/{created['id']}/deliveries").json()
    [delivery] = log["data"]
    assert (delivery["state"], delivery["event_type"], delivery["job_id"]) == (
        "succeeded",
        "reconfiguration.started",
        job.id,
    )
    assert [a["status_code"] for a in delivery["attempts"]] == [503, 500, 200]
    assert (
        client.get(f"/v1/webhooks/{created['id']}/deliveries", params={"state": "failed"}).json()["count"]
        == 0
    )


# --- /metrics -------------------------------------------------------------------------------------


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_count_finished_jobs_once_with_phase_durations(
    client: TestClient, session: Session, db_engine: Engine
) -> None:
    labels = {"deployment": "d1", "outcome": "succeeded", "requested_by": "api"}
    before = sample("epctl_reconfiguration_jobs_total", **labels)
    durations_before = sample(
        "epctl_reconfiguration_job_duration_seconds_count", deployment="d1", outcome="succeeded"
    )
    phase = {"deployment": "d1", "phase": "committing", "outcome": "succeeded"}
    phases_before = sample("epctl_reconfiguration_phase_duration_seconds_count", **phase)
    rows.run_to_success(session, rows.make_job(session, rows.make_deployment(session, "d1").id).id)
    worker = DeliveryWorker(db_engine, DeliveryPolicy())
    worker.dispatch_outbox()
    worker.dispatch_outbox()  # nothing left: no double count
    assert sample("epctl_reconfiguration_jobs_total", **labels) == before + 1
    assert (
        sample("epctl_reconfiguration_job_duration_seconds_count", deployment="d1", outcome="succeeded")
        == durations_before + 1
    )
    assert sample("epctl_reconfiguration_phase_duration_seconds_count", **phase) == phases_before + 1
    text = client.get("/metrics").text
    assert 'epctl_reconfiguration_jobs_total{deployment="d1",outcome="succeeded",requested_by="api"}' in text
    assert "rcfg_" not in text, "no job ids as labels"


def test_metrics_show_jobs_in_progress_from_the_database(client: TestClient, session: Session) -> None:
    job = rows.make_job(session, rows.make_deployment(session, "d1").id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert 'epctl_reconfiguration_jobs_in_progress{deployment="d1",state="preparing"} 1.0' in response.text
    assert 'epctl_reconfiguration_jobs_in_progress{deployment="d1",state="pending"} 0.0' in response.text


def test_agent_calls_are_counted_by_operation_and_outcome() -> None:
    before = sample("epctl_agent_calls_total", operation="prepare", outcome="ok")
    metrics.record_agent_call("prepare", "ok")
    assert sample("epctl_agent_calls_total", operation="prepare", outcome="ok") == before + 1
