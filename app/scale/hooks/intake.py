"""Who is calling a hook, established before anything is decided: a Standard Webhooks signature
(per-deployment or global inbound secret) or a bearer token with the scale permission.

A request that fails here is refused without a record (`service.refuse_anonymous`: a counter and a log
line), so anonymous callers cannot grow the database; from an authenticated caller on, every decision
is recorded once (`service.record`). Each function runs inside one `Database.run` call.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sqlmodel import Session

from app.core.auth import Permission, Principal, authorize
from app.core.config import Settings
from app.core.errors import AuthenticationError, DomainError
from app.scale.hooks import decide, notifications, service
from app.scale.hooks.models import AlertmanagerOutcome, HookSource
from app.tokens.models import TokenRole
from app.tokens.service import authenticate
from app.webhooks import signing

log = logging.getLogger(__name__)


def inbound_secrets(settings: Settings, deployment_name: str | None) -> list[tuple[str, str]]:
    """(scope, secret) pairs that may sign a request for this deployment: its own, then the global one."""
    found: list[tuple[str, str]] = []
    if deployment_name and deployment_name in settings.hooks_inbound_secrets:
        found.append(("deployment", settings.hooks_inbound_secrets[deployment_name].get_secret_value()))
    if settings.hooks_inbound_secret is not None:
        found.append(("global", settings.hooks_inbound_secret.get_secret_value()))
    return found


def bearer_caller(session: Session, authorization: str, source: HookSource) -> service.Caller:
    """The caller a bearer token establishes; a missing or unknown token is refused unrecorded, a token
    without the scale permission is refused and recorded (its holder is known)."""
    scheme, _, secret = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise service.refuse_anonymous(
            source, AuthenticationError("send `Authorization: Bearer <token>`", code="missing-token")
        )
    token = authenticate(session, secret=secret.strip())
    if token is None:
        raise service.refuse_anonymous(
            source, AuthenticationError("unknown or revoked token", code="invalid-token")
        )
    caller = service.Caller(source, requester=token.name)
    try:
        authorize(Principal(token_id=token.id, name=token.name, role=TokenRole(token.role)), Permission.scale)
    except DomainError as exc:
        raise service.reject(session, caller, exc) from None
    return caller


def signed_caller(
    session: Session,
    settings: Settings,
    *,
    headers: Mapping[str, str],
    body: bytes,
    deployment_name: str | None,
    now: float | None = None,
) -> service.Caller:
    """Check a Standard Webhooks signature and that its webhook-id is new; the caller it establishes.
    Raises HookSignatureError (401, unrecorded)."""
    candidates = inbound_secrets(settings, deployment_name)
    if not candidates:
        raise service.refuse_anonymous(
            HookSource.generic,
            service.HookSignatureError(
                "signed scale requests are not configured: set EPCTL_HOOKS_INBOUND_SECRET (or a "
                "per-deployment secret in EPCTL_HOOKS_INBOUND_SECRETS), or send a bearer token",
                code="signing-not-configured",
            ),
        )
    matched_scope: str | None = None
    try:
        for scope, secret in candidates:
            try:
                message_id, _ = signing.verify(
                    [secret], headers, body, now=now, tolerance_s=settings.hooks_signature_tolerance_s
                )
                matched_scope = scope
                break
            except signing.BadSignature:
                continue
            except signing.InvalidSecret:
                log.error("the %s inbound hook secret is not a whsec_ (base64) secret", scope)
                continue
        if matched_scope is None:
            raise signing.BadSignature("no signature matches a configured secret")
    except signing.SignatureError as exc:
        raise service.refuse_anonymous(
            HookSource.generic, service.HookSignatureError(str(exc), code=exc.reason)
        ) from None
    # A webhook-id seen before is a duplicate (its body the same) or refused (another body): `decide`.
    return service.Caller(HookSource.generic, requester=f"signature:{matched_scope}", webhook_id=message_id)


def scale_request(
    session: Session, settings: Settings, *, headers: Mapping[str, str], body: bytes
) -> service.HookOutcome:
    """`POST /v1/hooks/scale`, from authentication to the recorded decision."""
    authorization = headers.get("authorization", "").strip()
    if authorization:
        caller = bearer_caller(session, authorization, HookSource.generic)
    else:
        try:
            named = service.deployment_named_in(service.parse_json(body))
        except DomainError:
            named = None  # unreadable: only the global secret can vouch for it; 422 comes after
        if not signing.has_signature_headers(headers):
            raise service.refuse_anonymous(
                HookSource.generic,
                AuthenticationError(
                    "send a Standard Webhooks signature (webhook-id, webhook-timestamp, webhook-signature) "
                    "or `Authorization: Bearer <token>`",
                    code="missing-credentials",
                ),
            )
        caller = signed_caller(session, settings, headers=headers, body=body, deployment_name=named)
    try:
        document = service.parse_json(body)
        request = service.parse_scale_request(document)
    except DomainError as exc:
        raise service.reject(session, caller, exc) from None
    details = {"body": request.model_dump(exclude_none=True), "body_sha256": decide.body_digest(document)}
    return decide.decide(session, caller, request.ask(caller), details=details)


def alertmanager_request(
    session: Session, settings: Settings, *, headers: Mapping[str, str], body: bytes
) -> AlertmanagerOutcome:
    """`POST /v1/hooks/alertmanager`, from authentication to the recorded decisions."""
    authorization = headers.get("authorization", "").strip()
    if not authorization:
        raise service.refuse_anonymous(
            HookSource.alertmanager,
            AuthenticationError(
                "configure Alertmanager's webhook with `http_config.authorization` (an autoscaler token)",
                code="missing-token",
            ),
        )
    caller = bearer_caller(session, authorization, HookSource.alertmanager)
    try:
        payload = service.parse_alertmanager(service.parse_json(body))
    except DomainError as exc:
        raise service.reject(session, caller, exc) from None
    return notifications.handle_alertmanager(session, caller, payload)
