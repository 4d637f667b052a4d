"""Standard Webhooks in full, verified by the spec's own `standardwebhooks` library on the receiving side:
zero-downtime secret rotation (both signatures until the overlap ends), events queued for a disabled
subscription and delivered in sequence order on re-enable, replay with the same `webhook-id`, a retry
schedule spanning more than a day with jitter, a per-deployment sequence number in every payload."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session
from standardwebhooks.webhooks import Webhook

from app.core.clock import utc_now
from app.core.config import Settings
from app.webhooks import service
from app.webhooks.delivery import DeliveryPolicy, DeliveryWorker
from app.webhooks.models import EventType
from app.webhooks.replay import replay
from tests.operators import rows
from tests.operators.receiver import WebhookReceiver
from tests.operators.test_webhook_delivery import FAST, drain, outbox_ids, subscribe


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver().running() as receiver:
        yield receiver


def sequences(receiver: WebhookReceiver) -> list[int]:
    return [int(payload["data"]["sequence"]) for payload in receiver.processed.values()]


def one_event(session: Session, deployment_id: str) -> None:
    job = rows.make_job(session, deployment_id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)


def test_a_receiver_on_the_old_secret_verifies_until_the_rotation_overlap_ends(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver, EventType.started)
    old_secret = receiver.secret
    rotated = service.rotate_secret(session, subscription_id, overlap_s=3600)
    assert rotated.previous_secret_expires_at is not None and rotated.secret != old_secret
    one_event(session, deployment_id)
    drain(DeliveryWorker(engine, FAST))
    [during] = receiver.requests
    assert during.signature_valid and during.answered == 200  # verified with the old secret
    Webhook(rotated.secret).verify(during.body, during.headers)  # and with the new one
    assert len(during.headers["webhook-signature"].split(" ")) == 2

    after_overlap = utc_now() + timedelta(seconds=3601)
    one_event(session, rows.make_deployment(session, "d2").id)
    drain(DeliveryWorker(engine, FAST, clock=lambda: after_overlap), rounds=1)
    late = receiver.requests[-1]
    assert not late.signature_valid and late.answered == 401  # the old key no longer signs
    Webhook(rotated.secret).verify(late.body, late.headers)
    assert len(late.headers["webhook-signature"].split(" ")) == 1


def test_a_delivery_claimed_inside_the_overlap_is_signed_by_the_old_secret_only_until_it_ends(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    """The old secret's end holds for an attempt claimed before it too (issue 32)."""
    subscription_id = subscribe(session, receiver, EventType.started)
    rotated = service.rotate_secret(session, subscription_id, overlap_s=60)
    one_event(session, deployment_id)
    now = [utc_now()]
    worker = DeliveryWorker(engine, FAST, clock=lambda: now[0])
    worker.dispatch_outbox()
    [claimed] = worker.claim_due(1)
    assert len(claimed.secrets) == 2  # claimed inside the overlap
    now[0] = utc_now() + timedelta(seconds=61)  # the overlap ends before the attempt goes out

    async def attempt() -> None:
        async with httpx.AsyncClient() as client:
            await worker.attempt(client, claimed)

    asyncio.run(attempt())
    [request] = receiver.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 1 and not request.signature_valid
    Webhook(rotated.secret).verify(request.body, request.headers)


def test_rotation_without_overlap_switches_at_once(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver, EventType.started)
    rotated = service.rotate_secret(session, subscription_id, overlap_s=0)
    assert rotated.previous_secret_expires_at is None
    receiver.secret = rotated.secret
    one_event(session, deployment_id)
    drain(DeliveryWorker(engine, FAST))
    assert [r.signature_valid for r in receiver.requests] == [True]


def test_events_while_disabled_arrive_after_re_enable_in_sequence_order(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver)
    service.update_subscription(session, subscription_id, service.WebhookUpdate(active=False))
    for _ in range(2):
        rows.run_to_success(session, rows.make_job(session, deployment_id).id)
    worker = DeliveryWorker(engine, FAST)
    drain(worker)
    assert receiver.requests == []
    service.update_subscription(session, subscription_id, service.WebhookUpdate(active=True))
    drain(worker)
    assert list(receiver.processed) == outbox_ids(session)
    assert sequences(receiver) == list(range(1, len(outbox_ids(session)) + 1))
    assert all(r.signature_valid for r in receiver.requests)


def test_every_payload_carries_its_deployments_sequence_number(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscribe(session, receiver)
    other = rows.make_deployment(session, "d2").id
    rows.run_to_success(session, rows.make_job(session, deployment_id).id)
    rows.run_to_success(session, rows.make_job(session, other).id)
    drain(DeliveryWorker(engine, FAST))
    per_deployment: dict[str, list[int]] = {}
    for payload in receiver.processed.values():
        per_deployment.setdefault(payload["data"]["deployment_id"], []).append(payload["data"]["sequence"])
    assert per_deployment == {deployment_id: [1, 2, 3, 4, 5], other: [1, 2, 3, 4, 5]}


def test_a_disabled_subscriptions_backlog_is_bounded_and_replay_fills_the_gap(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    policy = DeliveryPolicy(**{**FAST.__dict__, "disabled_backlog": 2})
    subscription_id = subscribe(session, receiver)
    since = utc_now()
    service.update_subscription(session, subscription_id, service.WebhookUpdate(active=False))
    rows.run_to_success(session, rows.make_job(session, deployment_id).id)  # five events
    worker = DeliveryWorker(engine, policy)
    drain(worker)
    service.update_subscription(session, subscription_id, service.WebhookUpdate(active=True))
    drain(worker)
    assert sequences(receiver) == [1, 2]
    outcome = replay(session, subscription_id, since=since)
    assert outcome.queued == 5 and outcome.first_event_id == outbox_ids(session)[0]
    drain(worker)
    assert sequences(receiver) == [1, 2, 3, 4, 5]
    assert [r.webhook_id for r in receiver.requests] == outbox_ids(session)[:2] + outbox_ids(session)


def test_replay_resends_with_the_same_webhook_id_and_body(
    client: TestClient, engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver, EventType.started)
    before = utc_now() - timedelta(seconds=1)
    one_event(session, deployment_id)
    drain(DeliveryWorker(engine, FAST))
    response = client.post(f"/v1/webhooks/{subscription_id}/replay", params={"since": before.isoformat()})
    assert response.status_code == 202, response.text
    assert response.json()["queued"] == 1
    drain(DeliveryWorker(engine, FAST))
    first, again = receiver.requests
    assert first.webhook_id == again.webhook_id and first.body == again.body
    assert again.signature_valid


def test_replay_needs_a_time_zone_and_a_known_subscription(client: TestClient) -> None:
    created = client.post("/v1/webhooks", json={"url": "https://hooks.example/epctl"}).json()
    naive = client.post(f"/v1/webhooks/{created['id']}/replay", params={"since": "2026-12-01T12:00:00"})
    assert naive.status_code == 422 and naive.json()["code"] == "since-without-zone"
    missing = client.post("/v1/webhooks/whk_nope/replay", params={"since": "2026-12-01T12:00:00Z"})
    assert missing.status_code == 404


def test_rotate_secret_through_the_api_defaults_to_a_days_overlap(client: TestClient) -> None:
    created = client.post("/v1/webhooks", json={"url": "https://hooks.example/epctl"}).json()
    rotated = client.post(f"/v1/webhooks/{created['id']}/rotate-secret").json()
    ends = datetime.fromisoformat(rotated["previous_secret_expires_at"])
    assert timedelta(hours=23) < ends - datetime.now(UTC) <= timedelta(days=1)
    assert client.get(f"/v1/webhooks/{created['id']}").json()["previous_secret_expires_at"] is not None


def test_the_default_retry_schedule_spans_more_than_a_day_with_jitter(tmp_path: Any) -> None:
    policy = DeliveryPolicy.from_settings(Settings(data_dir=tmp_path))
    assert policy.span_s() >= 86400 and policy.jitter > 0
    rng = random.Random(7)
    delays = [policy.backoff_s(3, rng=rng) for _ in range(50)]
    plain = policy.plain_backoff_s(3)
    assert all(plain * (1 - policy.jitter) <= d <= plain * (1 + policy.jitter) for d in delays)
    assert len(set(delays)) > 40, "jitter spreads the retries"


def test_retries_follow_the_configured_schedule(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPCTL_WEBHOOK_RETRY_BASE_S", "60")
    monkeypatch.setenv("EPCTL_WEBHOOK_MAX_ATTEMPTS", "4")
    monkeypatch.setenv("EPCTL_WEBHOOK_RETRY_JITTER", "0")
    policy = DeliveryPolicy.from_settings(Settings(data_dir=tmp_path))
    assert policy.schedule_s() == [60, 120, 240]
