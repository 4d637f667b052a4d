"""Outbound webhooks: outbox -> signed deliveries to a real HTTP receiver, retries, Retry-After, 410."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.webhooks import service
from app.webhooks.delivery import DeliveryPolicy, DeliveryWorker, parse_retry_after
from app.webhooks.models import DeliveryState, EventType, OutboxEvent, WebhookDelivery, WebhookSubscription
from tests.operators import rows
from tests.operators.receiver import LOOPBACK, ScriptedResponse, WebhookReceiver

# The receivers listen on loopback: allowed here, as an operator would (app/core/targets.py).
FAST = DeliveryPolicy(
    poll_s=0.02, timeout_s=5.0, retry_base_s=0.01, retry_max_s=0.05, max_attempts=5, allow_networks=LOOPBACK
)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver().running() as receiver:
        yield receiver


def subscribe(session: Session, receiver: WebhookReceiver, *types: EventType) -> str:
    created = service.create_subscription(
        session, service.WebhookCreate(url=receiver.url, event_types=list(types))
    )
    receiver.secret = created.secret
    return created.id


def drain(worker: DeliveryWorker, rounds: int = 50) -> None:
    """Run the worker until nothing is due (retries are milliseconds apart with FAST)."""

    async def loop() -> None:
        for _ in range(rounds):
            if await worker.run_once() == 0 and not _pending(worker.engine):
                return
            await asyncio.sleep(0.02)

    asyncio.run(loop())


def _pending(engine: Engine) -> bool:
    """Deliveries still to attempt (those of a disabled subscription wait, so they do not count)."""
    with Session(engine) as session:
        return bool(
            session.exec(
                select(WebhookDelivery.id)
                .join(WebhookSubscription)
                .where(WebhookDelivery.state == DeliveryState.pending.value, WebhookSubscription.active)
            ).all()
        )


def _frozen_clock(at: datetime) -> Callable[[], datetime]:
    return lambda: at


def outbox_ids(session: Session, *types: EventType) -> list[str]:
    events = session.exec(
        select(OutboxEvent).order_by(col(OutboxEvent.created_at), col(OutboxEvent.id))
    ).all()
    return [e.id for e in events if not types or e.type in types]


def test_every_transition_arrives_signed_to_the_standard_webhooks_spec(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscribe(session, receiver)
    job = rows.make_job(session, deployment_id)
    rows.run_to_success(session, job.id)
    drain(DeliveryWorker(engine, FAST))
    assert all(r.signature_valid for r in receiver.requests)
    assert sorted(receiver.processed) == sorted(outbox_ids(session))
    in_order = [receiver.processed[event_id] for event_id in outbox_ids(session)]
    types = [body["type"] for body in in_order]
    assert types == ["reconfiguration.started"] + ["reconfiguration.phase_changed"] * 3 + [
        "reconfiguration.succeeded"
    ]
    last = in_order[-1]
    assert set(last) == {"type", "timestamp", "data"}
    assert last["data"]["id"] == job.id and last["data"]["state"] == "succeeded"


def test_subscription_gets_only_the_event_types_it_chose(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscribe(session, receiver, EventType.succeeded, EventType.failed)
    rows.run_to_success(session, rows.make_job(session, deployment_id).id)
    drain(DeliveryWorker(engine, FAST))
    assert [b["type"] for b in receiver.processed.values()] == ["reconfiguration.succeeded"]


def test_receiver_that_fails_then_recovers_gets_every_event_exactly_once_by_id(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver)
    receiver.respond(*[ScriptedResponse(500) for _ in range(3)], ScriptedResponse(503))
    rows.run_to_success(session, rows.make_job(session, deployment_id).id)
    drain(DeliveryWorker(engine, FAST))
    assert list(receiver.processed) == outbox_ids(session)  # in order: one delivery in flight at a time
    assert len(receiver.requests) == 4 + 5  # four failures, then each of the five events once
    log = service.list_deliveries(session, subscription_id)
    assert {d.state for d in log.data} == {DeliveryState.succeeded}
    retried = [d for d in log.data if d.attempt_count > 1]
    assert retried, "some delivery needed more than one attempt"
    for delivery in retried:
        assert [a.attempt for a in delivery.attempts] == list(range(1, delivery.attempt_count + 1))
        assert [a.status_code for a in delivery.attempts][-1] == 200
        ids = {r.webhook_id for r in receiver.requests if r.webhook_id == delivery.event_id}
        assert ids == {delivery.event_id}, "every attempt of one event carries the same webhook-id"


def test_gone_410_disables_the_subscription_and_queues_its_events_until_re_enabled(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver, EventType.started)
    receiver.respond(ScriptedResponse(410))
    job = rows.make_job(session, deployment_id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
    drain(DeliveryWorker(engine, FAST))
    assert not service.get_subscription(session, subscription_id).active
    [delivery] = service.list_deliveries(session, subscription_id).data
    assert delivery.state is DeliveryState.pending and "410" in (delivery.last_error or "")
    rows.run_to_success(session, rows.make_job(session, rows.make_deployment(session, "d2").id).id)
    drain(DeliveryWorker(engine, FAST))
    assert len(receiver.requests) == 1
    assert service.list_deliveries(session, subscription_id).count == 2
    service.update_subscription(session, subscription_id, service.WebhookUpdate(active=True))
    drain(DeliveryWorker(engine, FAST))
    assert list(receiver.processed) == outbox_ids(session, EventType.started)


def test_retry_after_seconds_sets_the_next_attempt_time(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver, EventType.started)
    receiver.respond(ScriptedResponse(429, {"Retry-After": "120"}))
    job = rows.make_job(session, deployment_id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
    fixed = datetime(2030, 1, 1, tzinfo=UTC)
    asyncio.run(DeliveryWorker(engine, FAST, clock=lambda: fixed).run_once())
    [delivery] = service.list_deliveries(session, subscription_id).data
    assert delivery.state is DeliveryState.pending and delivery.last_status_code == 429
    assert delivery.next_attempt_at == fixed + timedelta(seconds=120)


def test_retry_after_http_date_sets_the_next_attempt_time(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver, EventType.started)
    receiver.respond(ScriptedResponse(503, {"Retry-After": "Tue, 01 Jan 2030 00:05:00 GMT"}))
    job = rows.make_job(session, deployment_id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
    fixed = datetime(2030, 1, 1, tzinfo=UTC)
    asyncio.run(DeliveryWorker(engine, FAST, clock=lambda: fixed).run_once())
    [delivery] = service.list_deliveries(session, subscription_id).data
    assert delivery.next_attempt_at == fixed + timedelta(minutes=5)


def test_without_retry_after_the_delay_doubles_per_attempt(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    policy = DeliveryPolicy(retry_base_s=10, retry_max_s=1000, max_attempts=10, allow_networks=LOOPBACK)
    subscription_id = subscribe(session, receiver, EventType.started)
    receiver.respond(*[ScriptedResponse(500) for _ in range(3)])
    job = rows.make_job(session, deployment_id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    delays = []
    for _ in range(3):
        frozen = _frozen_clock(now)
        asyncio.run(DeliveryWorker(engine, policy, clock=frozen).run_once())
        [delivery] = service.list_deliveries(session, subscription_id).data
        assert delivery.next_attempt_at is not None
        delays.append((delivery.next_attempt_at - now).total_seconds())
        now = delivery.next_attempt_at
    assert delays == [10, 20, 40]


def test_delivery_fails_after_the_last_allowed_attempt(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver, EventType.started)
    receiver.respond(*[ScriptedResponse(500) for _ in range(10)])
    job = rows.make_job(session, deployment_id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
    drain(DeliveryWorker(engine, FAST))
    [delivery] = service.list_deliveries(session, subscription_id).data
    assert delivery.state is DeliveryState.failed
    assert delivery.attempt_count == FAST.max_attempts == len(delivery.attempts)
    assert "gave up after 5 attempts" in (delivery.last_error or "")


def test_unreachable_receiver_is_retried_and_the_error_logged(
    engine: Engine, session: Session, deployment_id: str
) -> None:
    created = service.create_subscription(session, service.WebhookCreate(url="http://127.0.0.1:9/nothing"))
    job = rows.make_job(session, deployment_id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
    asyncio.run(DeliveryWorker(engine, FAST).run_once())
    [delivery] = service.list_deliveries(session, created.id).data
    assert delivery.state is DeliveryState.pending and delivery.last_status_code is None
    assert delivery.attempts[0].error == "could not connect"


def test_a_url_stored_before_urls_were_checked_is_an_attempt_that_failed(
    engine: Engine, session: Session, deployment_id: str
) -> None:
    """A subscription row from before app/core/urls.py with a URL httpx refuses to send to (its host
    resolves nowhere either): each try is recorded as a failed attempt (retried, then given up), not an
    exception in the worker's loop."""
    subscription = WebhookSubscription(id="whk_old", url="http://a\x17b.example/", secret="whsec_" + "A" * 32)
    session.add(subscription)
    session.commit()
    job = rows.make_job(session, deployment_id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
    drain(DeliveryWorker(engine, FAST))
    [delivery] = service.list_deliveries(session, subscription.id).data
    assert delivery.state is DeliveryState.failed and len(delivery.attempts) == FAST.max_attempts
    assert (delivery.attempts[0].error or "").startswith("not sent: ")


@pytest.mark.databases("sqlite", "postgres")
def test_two_workers_on_one_database_deliver_each_event_once(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscribe(session, receiver)
    for name in ("a", "b", "c"):
        rows.run_to_success(session, rows.make_job(session, rows.make_deployment(session, name).id).id)

    async def both() -> None:
        first, second = DeliveryWorker(engine, FAST), DeliveryWorker(engine, FAST)
        for _ in range(20):
            await asyncio.gather(first.run_once(), second.run_once())
            if not _pending(engine):
                return

    asyncio.run(both())
    assert len(receiver.requests) == len(outbox_ids(session)) == 15
    assert len({r.webhook_id for r in receiver.requests}) == 15


def test_subscription_created_after_an_event_does_not_get_it(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    rows.run_to_success(session, rows.make_job(session, deployment_id).id)
    drain(DeliveryWorker(engine, FAST))
    subscribe(session, receiver)
    drain(DeliveryWorker(engine, FAST))
    assert receiver.requests == []
    assert all(e.dispatched_at is not None for e in session.exec(select(OutboxEvent)).all())


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("30", 30.0),
        ("0", 0.0),
        ("Tue, 01 Jan 2030 00:01:00 GMT", 60.0),
        ("soon", None),
        (None, None),
        ("Mon, 31 Dec 2029 23:00:00 GMT", 0.0),
    ],
)
def test_parse_retry_after(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, datetime(2030, 1, 1, tzinfo=UTC)) == seconds


def test_disabled_subscription_keeps_its_pending_deliveries_for_when_it_is_re_enabled(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription_id = subscribe(session, receiver, EventType.started)
    job = rows.make_job(session, deployment_id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)
    worker = DeliveryWorker(engine, FAST)
    worker.dispatch_outbox()
    service.update_subscription(session, subscription_id, service.WebhookUpdate(active=False))
    drain(worker)
    assert receiver.requests == []
    service.update_subscription(session, subscription_id, service.WebhookUpdate(active=True))
    drain(worker)
    assert len(receiver.processed) == 1
    assert session.get(WebhookSubscription, subscription_id) is not None
