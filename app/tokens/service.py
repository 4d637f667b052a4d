"""API tokens: create (the secret is returned once), list, revoke, authenticate. HTTP-free."""

from __future__ import annotations

import hashlib
import secrets
from contextlib import suppress
from datetime import timedelta

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import ConflictError, NotFoundError
from app.core.ids import new_id
from app.tokens.models import SECRET_MARKER, ApiToken, TokenRole, shown_prefix

TOKEN_ID_PREFIX = "tok"
SECRET_PREFIX = SECRET_MARKER
FIRST_ADMIN_NAME = "admin"
ENV_ADMIN_NAME = "admin-env"
# Reads must not turn into writes on every request; last_used_at is refreshed at most this often.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenNotFoundError(NotFoundError):
    code = "token-not-found"


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def create_token(
    session: Session, *, name: str, role: TokenRole, created_by: str | None = None, secret: str | None = None
) -> tuple[ApiToken, str]:
    """Returns the row and the secret (shown to the user once; only its hash is stored)."""
    secret = secret or generate_secret()
    token = ApiToken(
        id=new_id(TOKEN_ID_PREFIX),
        name=name,
        role=role.value,
        token_hash=hash_token(secret),
        token_prefix=shown_prefix(secret),
        created_by=created_by,
    )
    session.add(token)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise ConflictError(
            f"a token named {name!r} (or with this secret) already exists", code="token-exists", name=name
        ) from None
    return token, secret


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.exec(select(ApiToken).order_by(col(ApiToken.created_at))).all())


def get_token(session: Session, *, ref: str) -> ApiToken:
    token = session.get(ApiToken, ref) or session.exec(select(ApiToken).where(ApiToken.name == ref)).first()
    if token is None:
        raise TokenNotFoundError(f"no token {ref!r}", token=ref)
    return token


class LastAdminTokenError(ConflictError):
    code = "last-admin-token"


def revoke_token(session: Session, *, ref: str) -> ApiToken:
    """Revoke a token; never the last live admin token (nobody could manage tokens after it)."""
    token = get_token(session, ref=ref)
    if token.revoked_at is None and token.role == TokenRole.admin.value:
        # Locked (Postgres) so that two revocations at once cannot each leave the other the last one.
        admins = session.exec(
            select(ApiToken.id)
            .where(ApiToken.role == TokenRole.admin.value, col(ApiToken.revoked_at).is_(None))
            .with_for_update()
        ).all()
        if list(admins) == [token.id]:
            raise LastAdminTokenError(
                f"{token.name!r} is the last live admin token: create another admin token first",
                token=token.name,
            )
    if token.revoked_at is None:
        token.revoked_at = utc_now()
        session.add(token)
        session.commit()
    return token


def is_live(session: Session, *, token_id: str) -> bool:
    """Whether the token still exists and is not revoked (a long-held stream asks again and again)."""
    token = session.get(ApiToken, token_id)
    return token is not None and token.revoked_at is None


def authenticate(session: Session, *, secret: str) -> ApiToken | None:
    """The live token with this secret, or None."""
    token = session.exec(select(ApiToken).where(ApiToken.token_hash == hash_token(secret))).first()
    if token is None or token.revoked_at is not None:
        return None
    now = utc_now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        token.last_used_at = now
        session.add(token)
        session.commit()
    return token


def ensure_first_admin(session: Session, *, env_secret: str | None) -> str | None:
    """Make sure an admin can get in. EPCTL_ADMIN_TOKEN, when set, is always accepted: it is added if new,
    made live again if it was revoked (unset the variable to retire it), and a changed value replaces the
    previous env token. Without it, the first start generates one admin token and returns its secret (to
    print once); later starts return None."""
    if env_secret is not None:
        _ensure_env_admin(session, env_secret)
        return None
    if session.exec(select(ApiToken.id)).first() is not None:
        return None
    try:
        _, secret = create_token(
            session, name=FIRST_ADMIN_NAME, role=TokenRole.admin, created_by="first start"
        )
    except ConflictError:
        return None  # another coordinator generated it first
    return secret


def _ensure_env_admin(session: Session, env_secret: str) -> None:
    wanted = hash_token(env_secret)
    token = session.exec(select(ApiToken).where(ApiToken.token_hash == wanted)).first()
    if token is not None:
        if token.revoked_at is not None or token.role != TokenRole.admin.value:
            token.revoked_at = None  # documented: the env admin token is always accepted
            token.role = TokenRole.admin.value
            session.add(token)
            session.commit()
        return
    previous = session.exec(select(ApiToken).where(ApiToken.name == ENV_ADMIN_NAME)).first()
    if previous is not None:  # EPCTL_ADMIN_TOKEN changed: the new value replaces the old one
        previous.token_hash = wanted
        previous.token_prefix = shown_prefix(env_secret)
        previous.revoked_at = None
        previous.role = TokenRole.admin.value
        session.add(previous)
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
        return
    with suppress(ConflictError):  # another coordinator started at the same moment and added it
        create_token(
            session,
            name=ENV_ADMIN_NAME,
            role=TokenRole.admin,
            secret=env_secret,
            created_by="EPCTL_ADMIN_TOKEN",
        )
