"""`POST /v1/webhooks/{id}/replay?since=...`: send a subscription's events again, as they were.

Every dispatched outbox event created at or after `since` that the subscription wants is (re)queued:
its delivery to this subscription is set pending again (or created, for an event it missed while its
backlog was full or before it wanted that type). Attempts carry the event's own `webhook-id`,
payload and sequence number, so a receiver dedupes what it already has and fills its gaps in order.
Only events the outbox still keeps can be replayed (`EPCTL_RETENTION_*`). HTTP-free.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.ids import new_id
from app.webhooks.models import DeliveryState, OutboxEvent, WebhookDelivery
from app.webhooks.service import DELIVERY_ID_PREFIX, get_subscription, subscription_wants

MAX_REPLAY = 10000


class ReplayOutcome(BaseModel):
    subscription_id: str
    since: datetime
    queued: int = Field(description="events queued again (or for the first time) for this subscription")
    first_event_id: str | None = Field(None, description="the oldest event queued; its webhook-id")
    truncated: bool = Field(False, description=f"more than {MAX_REPLAY} events matched: replay again later")


def replay(
    session: Session, subscription_id: str, *, since: datetime, limit: int = MAX_REPLAY
) -> ReplayOutcome:
    subscription = get_subscription(session, subscription_id)
    now = utc_now()
    events = session.exec(
        select(OutboxEvent)
        .where(col(OutboxEvent.created_at) >= since, col(OutboxEvent.dispatched_at).is_not(None))
        .order_by(sa.func.coalesce(col(OutboxEvent.dispatch_order), 0), col(OutboxEvent.id))
        .limit(limit + 1)
    ).all()
    truncated = len(events) > limit
    wanted = [event for event in events[:limit] if subscription_wants(subscription, event.type)]
    existing = {
        delivery.event_id: delivery
        for delivery in session.exec(
            select(WebhookDelivery).where(
                col(WebhookDelivery.subscription_id) == subscription.id,
                col(WebhookDelivery.event_id).in_([event.id for event in wanted]),
            )
        ).all()
    }
    for event in wanted:
        delivery = existing.get(event.id)
        if delivery is None:
            delivery = WebhookDelivery(
                id=new_id(DELIVERY_ID_PREFIX),
                event_id=event.id,
                subscription_id=subscription.id,
                created_at=now,
            )
        delivery.state = DeliveryState.pending.value
        delivery.attempt_count = 0
        delivery.next_attempt_at = now
        delivery.delivered_at = None
        delivery.last_error = f"replay requested at {now.isoformat(timespec='seconds')}"
        delivery.updated_at = now
        session.add(delivery)
    session.commit()
    return ReplayOutcome(
        subscription_id=subscription.id,
        since=since,
        queued=len(wanted),
        first_event_id=wanted[0].id if wanted else None,
        truncated=truncated,
    )
