"""Outbound webhook tables: subscriptions, the outbox of events (written in the same transaction as the
job change that caused them), one delivery per (event, subscription), and each delivery attempt."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.core.clock import utc_now
from app.core.db import UTCDateTime

OUTBOX_ID_PREFIX = "msg"  # outbox ids double as the Standard Webhooks `webhook-id`


class EventType(StrEnum):
    started = "reconfiguration.started"
    phase_changed = "reconfiguration.phase_changed"
    succeeded = "reconfiguration.succeeded"
    failed = "reconfiguration.failed"
    rolled_back = "reconfiguration.rolled_back"
    cancelled = "reconfiguration.cancelled"
    cleanup_failed = "reconfiguration.cleanup_failed"
    engine_unreachable = "engine.unreachable"  # heartbeats stopped (a member's deployment is degraded)
    deployment_degraded = "deployment.degraded"  # its engines no longer all serve its generation
    deployment_recovered = "deployment.recovered"  # every member serves its generation again
    incident_opened = "incident.opened"  # a deployment stopped being whole (app.deployments.incidents)
    incident_resolved = "incident.resolved"  # ... and is whole again: how long it took
    autoscaler_decision = "autoscaler.decision"  # an intent was taken, deferred, held, paused, withdrawn...


class DeliveryState(StrEnum):
    pending = "pending"  # waiting for its (next) attempt
    succeeded = "succeeded"
    failed = "failed"  # retries exhausted


class WebhookSubscription(SQLModel, table=True):
    __tablename__ = "webhook_subscriptions"

    id: str = Field(primary_key=True, max_length=40)
    url: str = Field(max_length=2048)
    secret: str = Field(max_length=200, description="Standard Webhooks signing secret (whsec_...)")
    # Rotation: the secret replaced last keeps signing (a second signature) until this time.
    previous_secret: str | None = Field(default=None, max_length=200)
    previous_secret_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    event_types: list[str] = Field(default_factory=list, sa_type=sa.JSON, description="empty: all")
    description: str | None = Field(default=None, max_length=500)
    active: bool = True
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


class OutboxEvent(SQLModel, table=True):
    __tablename__ = "outbox_events"
    __table_args__ = (sa.Index("ix_outbox_events_created_at", "created_at"),)

    id: str = Field(primary_key=True, max_length=40)
    type: str = Field(max_length=64, index=True)
    job_id: str | None = Field(default=None, max_length=40, index=True)
    deployment_id: str | None = Field(default=None, max_length=40)
    payload: dict[str, Any] = Field(sa_type=sa.JSON, description="{type, timestamp, data}")
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    dispatched_at: datetime | None = Field(
        default=None, sa_type=UTCDateTime, index=True, description="when deliveries were created for it"
    )
    sequence: int | None = Field(
        default=None, description="per deployment, from 1, given at dispatch; also `data.sequence`"
    )
    dispatch_order: int | None = Field(
        default=None,
        index=True,
        description="across all events, given at dispatch with `sequence` (so it orders each deployment's "
        "events as `sequence` does): the one order of sending and replay",
    )


class WebhookSequence(SQLModel, table=True):
    """The last sequence number given to a deployment's events ('' for events of no deployment)."""

    __tablename__ = "webhook_sequences"

    deployment_id: str = Field(primary_key=True, max_length=40)
    last_sequence: int = 0


class WebhookDelivery(SQLModel, table=True):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        sa.UniqueConstraint("event_id", "subscription_id", name="uq_webhook_deliveries_event_subscription"),
    )

    id: str = Field(primary_key=True, max_length=40)
    event_id: str = Field(
        sa_column_args=[sa.ForeignKey("outbox_events.id", ondelete="CASCADE")], max_length=40
    )
    subscription_id: str = Field(
        sa_column_args=[sa.ForeignKey("webhook_subscriptions.id", ondelete="CASCADE")],
        max_length=40,
        index=True,
    )
    state: str = Field(default=DeliveryState.pending.value, sa_type=sa.String(16), index=True)
    attempt_count: int = 0
    next_attempt_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_status_code: int | None = None
    last_error: str | None = Field(default=None, max_length=2000)
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


class WebhookDeliveryAttempt(SQLModel, table=True):
    __tablename__ = "webhook_delivery_attempts"

    id: int | None = Field(default=None, primary_key=True)
    delivery_id: str = Field(
        sa_column_args=[sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE")], max_length=40, index=True
    )
    attempt: int
    status_code: int | None = None
    error: str | None = Field(default=None, max_length=2000)
    duration_ms: float = 0.0
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
