"""Webhooks in one order (issue 36): events are numbered (`data.sequence`, per deployment), sent and
replayed in the same order, so every receiver sees each deployment's sequence strictly increasing, also
when one request writes two decision events (an intent replaced: the old one's `superseded` and the new
one's decision; an Alertmanager group joined by an alert) and when an event's time is older than an
event written before it in the same transaction. Through the real intake, dispatcher, delivery worker
and a real HTTP receiver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core.clock import utc_now
from app.scale.hooks.alertmanager import AlertmanagerPayload
from app.scale.hooks.decide import decide
from app.scale.hooks.models import HookSource
from app.scale.hooks.notifications import handle_alertmanager
from app.scale.hooks.service import Caller, ScaleRequest
from app.webhooks.delivery import DeliveryWorker
from app.webhooks.models import EventType
from app.webhooks.outbox import enqueue_event
from app.webhooks.replay import replay
from tests.operators.alertmanager_payloads import alert, payload
from tests.operators.receiver import WebhookReceiver
from tests.operators.test_webhook_delivery import FAST, drain, subscribe

KEDA = Caller(HookSource.generic, requester="keda")
ALERTMANAGER = Caller(HookSource.alertmanager, requester="alertmanager")


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver().running() as running:
        yield running


def _sequences(receiver: WebhookReceiver) -> list[int]:
    """`data.sequence` of each request, in arrival order (every event here is deployment d1's)."""
    return [int(json.loads(request.body)["data"]["sequence"]) for request in receiver.requests]


def _group(*members: str) -> dict[str, object]:
    alerts = [alert(deployment="d1", alertname="Busy", labels={"step": "+1", "instance": m}) for m in members]
    return payload(alerts, group_key='{}:{alertname="Busy"}')


@pytest.mark.databases("sqlite", "postgres")
def test_sequence_strictly_increases_in_arrival_order_and_on_replay(
    engine: Engine, session: Session, deployment_id: str, receiver: WebhookReceiver
) -> None:
    subscription = subscribe(session, receiver)
    start = utc_now() - timedelta(seconds=1)
    # An intent replaced twice: each request ends the standing intent and records the new one.
    for size in (3, 4, 1):
        decide(
            session, KEDA, ScaleRequest.model_validate({"deployment": "d1", "target_dp_size": size}).ask(KEDA)
        )
    # An Alertmanager group joined by an alert: a new identity, the group's standing intent replaced.
    handle_alertmanager(session, ALERTMANAGER, AlertmanagerPayload.model_validate(_group("a")))
    handle_alertmanager(session, ALERTMANAGER, AlertmanagerPayload.model_validate(_group("a", "b")))
    # Two events of one transaction whose times disagree with the order they were written in.
    later = utc_now() + timedelta(seconds=5)
    enqueue_event(
        session,
        EventType.autoscaler_decision,
        {"deployment": "d1", "n": 1},
        deployment_id=deployment_id,
        now=later,
    )
    enqueue_event(
        session,
        EventType.autoscaler_decision,
        {"deployment": "d1", "n": 2},
        deployment_id=deployment_id,
        now=later - timedelta(seconds=4),
    )
    session.commit()

    drain(DeliveryWorker(engine, FAST))
    sent = _sequences(receiver)
    assert len(sent) >= 9 and sent == sorted(sent) and len(set(sent)) == len(sent), sent
    assert sent == list(range(1, len(sent) + 1))  # no gap either

    receiver.requests.clear()
    assert replay(session, subscription, since=start).queued == len(sent)
    drain(DeliveryWorker(engine, FAST))
    assert _sequences(receiver) == sent  # replayed in the same order
