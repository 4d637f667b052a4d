"""Outbound webhook subscriptions and their delivery log: HTTP-free functions taking a `session`.

A subscription's secret (`whsec_...`) is generated here and returned once, by `create_subscription`
and `rotate_secret`; later reads never show it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import NotFoundError
from app.core.ids import new_id
from app.core.sealing import seal, unseal
from app.core.shapes import RowShape
from app.core.urls import checked_http_url
from app.webhooks import signing
from app.webhooks.models import (
    DeliveryState,
    EventType,
    OutboxEvent,
    WebhookDelivery,
    WebhookDeliveryAttempt,
    WebhookSubscription,
)

SUBSCRIPTION_ID_PREFIX = "whk"
URL_PATTERN = r"^https?://[^\s/?#@]+(@[^\s/?#]+)?([/?#]\S*)?$"  # absolute http(s), a host, no spaces
DELIVERY_ID_PREFIX = "dlv"


REDACTED = "***"


def redact_url(url: str) -> str:
    """The URL without what may authenticate it: user info, path and query values are replaced (a path
    can be the credential itself, as in chat webhook URLs); scheme, host and port stay."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    netloc = (f"{REDACTED}@" if parts.username or parts.password else "") + host
    if port is not None:
        netloc += f":{port}"
    path = "/" + REDACTED if parts.path not in ("", "/") else parts.path
    query = "&".join(f"{pair.partition('=')[0]}={REDACTED}" for pair in parts.query.split("&") if pair)
    return urlunsplit((parts.scheme, netloc, path, query, ""))


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2048, pattern=URL_PATTERN, description="where events are POSTed")
    event_types: list[EventType] = Field(
        default_factory=list, max_length=len(EventType), description="empty: every event type"
    )
    description: str | None = Field(None, max_length=500)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return checked_http_url(value)


class WebhookUpdate(BaseModel):
    """Only the fields given change; `active: true` re-enables a subscription disabled by a 410."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(None, max_length=2048, pattern=URL_PATTERN)
    event_types: list[EventType] | None = Field(None, max_length=len(EventType))
    description: str | None = Field(None, max_length=500)
    active: bool | None = Field(None, strict=True)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else checked_http_url(value)


class WebhookPublic(RowShape):
    id: str
    url: str
    event_types: list[EventType]
    description: str | None
    active: bool
    previous_secret_expires_at: datetime | None = Field(
        None, description="after a rotation: the old secret also signs (a second signature) until then"
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def derived(cls, row: WebhookSubscription) -> dict[str, Any]:
        overlap_ends = row.previous_secret_expires_at  # shown only while the overlap lasts
        return {
            "event_types": row.event_types or [],
            "previous_secret_expires_at": overlap_ends if overlap_ends and overlap_ends > utc_now() else None,
        }


class WebhookCreated(WebhookPublic):
    secret: str = Field(description="the Standard Webhooks signing secret (whsec_...): shown only here")


class WebhookList(BaseModel):
    data: list[WebhookPublic]
    count: int


class DeliveryAttemptPublic(BaseModel):
    attempt: int
    status_code: int | None
    error: str | None
    duration_ms: float
    created_at: datetime


class DeliveryPublic(BaseModel):
    id: str
    event_id: str = Field(description="the outbox event; also the `webhook-id` header of every attempt")
    event_type: str
    job_id: str | None
    state: DeliveryState
    attempt_count: int
    next_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    created_at: datetime
    attempts: list[DeliveryAttemptPublic]


class DeliveryList(BaseModel):
    data: list[DeliveryPublic]
    count: int = Field(description="deliveries of this subscription, over all pages")


class SubscriptionNotFound(NotFoundError):
    code = "webhook-not-found"


def create_subscription(session: Session, data: WebhookCreate) -> WebhookCreated:
    now = utc_now()
    secret = signing.generate_secret()
    row = WebhookSubscription(
        id=new_id(SUBSCRIPTION_ID_PREFIX),
        url=data.url,
        secret=seal(secret),
        event_types=[t.value for t in data.event_types],
        description=data.description,
        active=True,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    session.commit()
    return WebhookCreated.of(row, secret=secret)


def get_subscription(session: Session, subscription_id: str) -> WebhookSubscription:
    row = session.get(WebhookSubscription, subscription_id)
    if row is None:
        raise SubscriptionNotFound(f"no webhook subscription {subscription_id}", webhook_id=subscription_id)
    return row


def list_subscriptions(session: Session) -> WebhookList:
    rows = session.exec(select(WebhookSubscription).order_by(col(WebhookSubscription.created_at))).all()
    return WebhookList(data=[WebhookPublic.model_validate(r) for r in rows], count=len(rows))


def update_subscription(session: Session, subscription_id: str, data: WebhookUpdate) -> WebhookPublic:
    row = get_subscription(session, subscription_id)
    given = data.model_dump(exclude_unset=True)
    if given.get("url") is not None:
        row.url = given["url"]
    if given.get("event_types") is not None:
        row.event_types = [EventType(t).value for t in given["event_types"]]
    if "description" in given:
        row.description = given["description"]
    if given.get("active") is not None:
        row.active = bool(given["active"])
    row.updated_at = utc_now()
    session.add(row)
    session.commit()
    return WebhookPublic.model_validate(row)


def rotate_secret(session: Session, subscription_id: str, *, overlap_s: float = 0.0) -> WebhookCreated:
    """A new secret, signing from the next attempt on; shown once. For `overlap_s` the replaced secret
    signs too (Standard Webhooks' signature list), so a receiver can switch keys without downtime."""
    row = get_subscription(session, subscription_id)
    now = utc_now()
    if overlap_s > 0:
        row.previous_secret = row.secret
        row.previous_secret_expires_at = now + timedelta(seconds=overlap_s)
    else:
        row.previous_secret, row.previous_secret_expires_at = None, None
    secret = signing.generate_secret()
    row.secret = seal(secret)
    row.updated_at = now
    session.add(row)
    session.commit()
    return WebhookCreated.of(row, secret=secret)


def delete_subscription(session: Session, subscription_id: str) -> None:
    row = get_subscription(session, subscription_id)
    # Explicit, not only ON DELETE CASCADE: SQLite enforces it only with foreign_keys=ON.
    delivery_ids = select(WebhookDelivery.id).where(WebhookDelivery.subscription_id == subscription_id)
    session.execute(
        sa.delete(WebhookDeliveryAttempt).where(col(WebhookDeliveryAttempt.delivery_id).in_(delivery_ids))
    )
    session.execute(sa.delete(WebhookDelivery).where(col(WebhookDelivery.subscription_id) == subscription_id))
    session.delete(row)
    session.commit()


def list_deliveries(
    session: Session,
    subscription_id: str,
    *,
    state: DeliveryState | None = None,
    limit: int = 50,
    offset: int = 0,
) -> DeliveryList:
    """Newest first, each with every attempt (oldest attempt first)."""
    get_subscription(session, subscription_id)
    conditions: list[Any] = [WebhookDelivery.subscription_id == subscription_id]
    if state is not None:
        conditions.append(WebhookDelivery.state == state.value)
    total = session.execute(
        sa.select(sa.func.count()).select_from(WebhookDelivery).where(*conditions)
    ).scalar_one()
    rows = session.exec(
        select(WebhookDelivery, OutboxEvent)
        .join(OutboxEvent, col(OutboxEvent.id) == col(WebhookDelivery.event_id))
        .where(*conditions)
        .order_by(col(WebhookDelivery.created_at).desc(), col(WebhookDelivery.id).desc())
        .offset(offset)
        .limit(limit)
    ).all()
    attempts_by_delivery: dict[str, list[DeliveryAttemptPublic]] = {}
    if rows:
        attempt_rows = session.exec(
            select(WebhookDeliveryAttempt)
            .where(col(WebhookDeliveryAttempt.delivery_id).in_([d.id for d, _ in rows]))
            .order_by(col(WebhookDeliveryAttempt.attempt), col(WebhookDeliveryAttempt.id))
        ).all()
        for attempt in attempt_rows:
            attempts_by_delivery.setdefault(attempt.delivery_id, []).append(
                DeliveryAttemptPublic(
                    attempt=attempt.attempt,
                    status_code=attempt.status_code,
                    error=attempt.error,
                    duration_ms=attempt.duration_ms,
                    created_at=attempt.created_at,
                )
            )
    return DeliveryList(
        data=[
            DeliveryPublic(
                id=delivery.id,
                event_id=delivery.event_id,
                event_type=event.type,
                job_id=event.job_id,
                state=DeliveryState(delivery.state),
                attempt_count=delivery.attempt_count,
                next_attempt_at=delivery.next_attempt_at,
                last_status_code=delivery.last_status_code,
                last_error=delivery.last_error,
                delivered_at=delivery.delivered_at,
                created_at=delivery.created_at,
                attempts=attempts_by_delivery.get(delivery.id, []),
            )
            for delivery, event in rows
        ],
        count=int(total),
    )


def signing_secrets(row: WebhookSubscription, now: datetime) -> list[str]:
    """The secrets that sign an attempt now: the current one, then the replaced one until its overlap ends."""
    secrets = [opened_secret(row.secret)]
    if row.previous_secret and row.previous_secret_expires_at and row.previous_secret_expires_at > now:
        secrets.append(opened_secret(row.previous_secret))
    return secrets


def opened_secret(stored: str) -> str:
    """A stored signing secret in clear: sealed (`app.core.sealing`) since issue 25, or a bare `whsec_`
    written before, read as it is (it is sealed at its next rotation)."""
    return stored if stored.startswith(signing.SECRET_PREFIX) else unseal(stored)


def subscription_wants(subscription: WebhookSubscription, event_type: str) -> bool:
    return not subscription.event_types or event_type in subscription.event_types


PRUNE_BATCH = 2000


def prune_deliveries(session: Session, *, older_than: datetime) -> tuple[int, int]:
    """Retention: finished deliveries (succeeded or failed) last changed before `older_than`, with their
    attempts, then dispatched outbox events created before it that no delivery refers to any more.
    Pending deliveries and undispatched events are never pruned (they are still owed). Returns
    (deliveries, events) deleted, in batches of PRUNE_BATCH rows per transaction."""
    finished = [DeliveryState.succeeded.value, DeliveryState.failed.value]
    deliveries = 0
    while True:
        ids = list(
            session.exec(
                select(WebhookDelivery.id)
                .where(col(WebhookDelivery.state).in_(finished), col(WebhookDelivery.updated_at) < older_than)
                .limit(PRUNE_BATCH)
            ).all()
        )
        if not ids:
            break
        session.execute(
            sa.delete(WebhookDeliveryAttempt).where(col(WebhookDeliveryAttempt.delivery_id).in_(ids))
        )
        session.execute(sa.delete(WebhookDelivery).where(col(WebhookDelivery.id).in_(ids)))
        session.commit()
        deliveries += len(ids)
    events = 0
    referenced = sa.exists().where(col(WebhookDelivery.event_id) == col(OutboxEvent.id))
    while True:
        ids = list(
            session.exec(
                select(OutboxEvent.id)
                .where(
                    col(OutboxEvent.created_at) < older_than,
                    col(OutboxEvent.dispatched_at).is_not(None),
                    ~referenced,
                )
                .limit(PRUNE_BATCH)
            ).all()
        )
        if not ids:
            break
        session.execute(sa.delete(OutboxEvent).where(col(OutboxEvent.id).in_(ids)))
        session.commit()
        events += len(ids)
    return deliveries, events
