"""Webhook signing secrets at rest: sealed with EPCTL_SECRET_KEY (Fernet), marked clear without it,
and a bare `whsec_` written before sealing still signs."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import text
from sqlmodel import Session

from app.core.clock import utc_now
from app.core.sealing import SECRET_KEY_ENV
from app.webhooks import service
from app.webhooks.models import EventType, WebhookSubscription


def stored(session: Session, webhook_id: str) -> tuple[str, str | None]:
    row = session.execute(
        text("SELECT secret, previous_secret FROM webhook_subscriptions WHERE id = :id"), {"id": webhook_id}
    ).one()
    return row[0], row[1]


def subscribe(session: Session) -> service.WebhookCreated:
    body = service.WebhookCreate(url="http://127.0.0.1:9/hook", event_types=[EventType.succeeded])
    return service.create_subscription(session, body)


def test_with_a_key_the_signing_secrets_are_stored_encrypted(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_KEY_ENV, Fernet.generate_key().decode())
    created = subscribe(session)
    secret, _ = stored(session, created.id)
    assert secret.startswith("fernet:") and created.secret not in secret
    rotated = service.rotate_secret(session, created.id, overlap_s=60)
    secret, previous = stored(session, created.id)
    assert secret.startswith("fernet:") and rotated.secret not in secret
    assert previous is not None and previous.startswith("fernet:") and created.secret not in previous
    row = service.get_subscription(session, created.id)
    assert service.signing_secrets(row, utc_now()) == [rotated.secret, created.secret]


def test_without_a_key_they_are_marked_clear_and_older_bare_ones_still_sign(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_KEY_ENV, raising=False)
    created = subscribe(session)
    assert stored(session, created.id)[0] == f"clear:{created.secret}"
    row = session.get(WebhookSubscription, created.id)
    assert row is not None
    row.secret = created.secret  # as written before secrets were sealed
    session.add(row)
    session.commit()
    assert service.signing_secrets(row, utc_now()) == [created.secret]
