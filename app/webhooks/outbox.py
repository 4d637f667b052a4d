"""The one way an event is written to the outbox: in the caller's transaction, so the record change and
its event commit together (delivery happens afterwards, `app.webhooks.dispatch`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlmodel import Session

from app.core.clock import utc_now
from app.core.ids import new_id
from app.webhooks.models import OUTBOX_ID_PREFIX, EventType, OutboxEvent


def enqueue_event(
    session: Session,
    event_type: EventType | str,
    data: Mapping[str, Any],
    *,
    deployment_id: str | None = None,
    job_id: str | None = None,
    now: datetime | None = None,
) -> OutboxEvent:
    """Add `{type, timestamp, data}` to the outbox (the caller commits)."""
    kind = event_type.value if isinstance(event_type, EventType) else event_type
    at = now or utc_now()
    event = OutboxEvent(
        id=new_id(OUTBOX_ID_PREFIX),
        type=kind,
        job_id=job_id,
        deployment_id=deployment_id,
        payload={"type": kind, "timestamp": at.isoformat(), "data": dict(data)},
        created_at=at,
    )
    session.add(event)
    return event
