"""Step 1 of delivery: outbox event -> one delivery per subscription that wants it, and its sequence.

An outbox event (written in the same transaction as the job change) is claimed with
`UPDATE outbox_events SET dispatched_at = now WHERE id = :id AND dispatched_at IS NULL`; the winner
creates the deliveries in the same transaction. A crash before the commit leaves the event
undispatched, so the next worker (after a restart, or another coordinator) dispatches it: no event is
lost. Safe with several coordinators on one database.

- **Sequence**: the claim gives the event the next number of its deployment (`webhook_sequences`, from
  1; events of no deployment count under ''), stored on the event and in its payload as
  `data.sequence`, so a receiver can order and spot gaps. Events are dispatched in the order they were
  written (outbox ids; one request's events in the order it wrote them). In the same transaction the
  event also takes the next number of one counter across all events (`dispatch_order`): deliveries
  are sent, and replayed, in that order, so every receiver sees each deployment's `data.sequence`
  strictly increasing, replays included (issue 36: numbering, sending and replay had three orders).
- **Disabled subscriptions** get deliveries too, up to `disabled_backlog` pending ones each: they wait
  and go out, in order, when it is re-enabled. Events beyond the bound are counted, not queued;
  `POST /v1/webhooks/{id}/replay?since=...` re-sends them while the outbox keeps them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app import metrics
from app.core.clock import utc_now
from app.core.ids import new_id
from app.webhooks.models import (
    DeliveryState,
    EventType,
    OutboxEvent,
    WebhookDelivery,
    WebhookSequence,
    WebhookSubscription,
)
from app.webhooks.policy import DeliveryPolicy
from app.webhooks.service import DELIVERY_ID_PREFIX, subscription_wants

log = logging.getLogger(__name__)

DISPATCH_ORDER_KEY = "*"  # the counter across all events (deployment ids never are "*")
TERMINAL_EVENT_TYPES = frozenset(
    {EventType.succeeded, EventType.failed, EventType.rolled_back, EventType.cancelled}
)


class Dispatcher:
    def __init__(
        self, engine: Engine, policy: DeliveryPolicy, clock: Callable[[], datetime] = utc_now
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.clock = clock

    def dispatch_outbox(self) -> int:
        """Create the deliveries of every undispatched outbox event; return how many events were taken."""
        with Session(self.engine, expire_on_commit=False) as session:
            candidates = session.exec(
                select(OutboxEvent.id)
                .where(col(OutboxEvent.dispatched_at).is_(None))
                .order_by(col(OutboxEvent.id))
                .limit(self.policy.dispatch_batch)
            ).all()
        taken = 0
        for event_id in candidates:
            if self._dispatch_one(event_id):
                taken += 1
        return taken

    def _dispatch_one(self, event_id: str) -> bool:
        now = self.clock()
        with Session(self.engine, expire_on_commit=False) as session:
            claimed = session.execute(
                sa.update(OutboxEvent)
                .where(col(OutboxEvent.id) == event_id, col(OutboxEvent.dispatched_at).is_(None))
                .values(dispatched_at=now)
            )
            if claimed.rowcount != 1:  # type: ignore[attr-defined]
                session.rollback()
                return False
            event = session.get(OutboxEvent, event_id)
            assert event is not None
            try:
                sequence = next_sequence(session, event.deployment_id or "")
                # After the deployment's number (its row is held until commit), so two coordinators'
                # events of one deployment take their dispatch_order in their sequence's order.
                event.dispatch_order = next_sequence(session, DISPATCH_ORDER_KEY)
            except IntegrityError:  # another coordinator numbered this deployment's first event: later
                session.rollback()
                return False
            payload = dict(event.payload or {})
            payload["data"] = {**(payload.get("data") or {}), "sequence": sequence}
            event.payload = payload
            event.sequence = sequence
            session.add(event)
            for subscription in session.exec(select(WebhookSubscription)).all():
                if not subscription_wants(subscription, event.type):
                    continue
                if not subscription.active and self._backlog_full(session, subscription):
                    metrics.record_webhook_delivery("not_queued")
                    log.warning(
                        "webhook %s is disabled and has %d events waiting: event %s not queued (replay it)",
                        subscription.id,
                        self.policy.disabled_backlog,
                        event.id,
                    )
                    continue
                session.add(
                    WebhookDelivery(
                        id=new_id(DELIVERY_ID_PREFIX),
                        event_id=event.id,
                        subscription_id=subscription.id,
                        state=DeliveryState.pending.value,
                        next_attempt_at=now,
                        created_at=now,
                        updated_at=now,
                    )
                )
            event_type = event.type
            session.commit()
        # Each outbox event is dispatched exactly once across coordinators: count finished jobs here.
        if event_type in TERMINAL_EVENT_TYPES:
            observe_finished_job(payload.get("data") or {})
        return True

    def _backlog_full(self, session: Session, subscription: WebhookSubscription) -> bool:
        waiting = session.execute(
            sa.select(sa.func.count())
            .select_from(WebhookDelivery)
            .where(
                col(WebhookDelivery.subscription_id) == subscription.id,
                col(WebhookDelivery.state) == DeliveryState.pending.value,
            )
        ).scalar_one()
        return int(waiting) >= self.policy.disabled_backlog


def next_sequence(session: Session, key: str) -> int:
    """The next sequence number of `key` (a deployment id, or ''), counted inside the caller's
    transaction (the row stays locked on Postgres until it commits)."""
    bumped = session.execute(
        sa.update(WebhookSequence)
        .where(col(WebhookSequence.deployment_id) == key)
        .values(last_sequence=col(WebhookSequence.last_sequence) + 1)
    )
    if bumped.rowcount == 0:  # type: ignore[attr-defined]
        session.add(WebhookSequence(deployment_id=key, last_sequence=1))
        session.flush()
        return 1
    return int(
        session.execute(
            sa.select(col(WebhookSequence.last_sequence)).where(col(WebhookSequence.deployment_id) == key)
        ).scalar_one()
    )


def observe_finished_job(job: dict[str, Any]) -> None:
    phase_durations: dict[str, float] = {}
    for phase, times in (job.get("phases") or {}).items():
        try:
            started = datetime.fromisoformat(times["started_at"])
            ended = datetime.fromisoformat(times["ended_at"])
        except (KeyError, TypeError, ValueError):
            continue
        seconds = (ended - started).total_seconds()
        if math.isfinite(seconds):
            phase_durations[phase] = seconds
    downtime = job.get("downtime_ms")
    outage, slowest = job.get("client_outage_ms"), job.get("client_slowest_answer_ms")
    duration: float | None = None
    try:
        duration = (
            datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["created_at"])
        ).total_seconds()
    except (KeyError, TypeError, ValueError):
        duration = None
    metrics.observe_job_finished(
        outcome=str(job.get("state", "unknown")),
        requested_by=str(job.get("requested_by", "unknown")),
        downtime_ms=float(downtime) if isinstance(downtime, int | float) else None,
        phase_durations_s=phase_durations,
        deployment=str(job.get("deployment") or ""),
        duration_s=duration if duration is not None and math.isfinite(duration) else None,
        client_outage_ms=float(outage) if isinstance(outage, int | float) else None,
        client_slowest_answer_ms=float(slowest) if isinstance(slowest, int | float) else None,
    )
    counted = job.get("front_door_requests")
    if isinstance(counted, dict):
        metrics.record_front_door_requests(str(job.get("deployment") or ""), counted)
