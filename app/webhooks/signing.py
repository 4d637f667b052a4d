"""Standard Webhooks signing and verification (https://www.standardwebhooks.com).

A message is signed as `v1,<base64 HMAC-SHA256(secret, "<webhook-id>.<webhook-timestamp>.<body>")>`,
where the secret is the base64 text after `whsec_`. The same module signs outbound deliveries and
verifies inbound scale requests, so both sides agree byte for byte; tests cross-check it against the
spec's own `standardwebhooks` package.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"
# The spec's recommended tolerance: a message older (or newer) than this is refused as stale.
DEFAULT_TOLERANCE_S = 5 * 60

HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"
MAX_MESSAGE_ID_LENGTH = 128  # stored (unique) to refuse replays
_PRINTABLE_ASCII = re.compile(r"^[!-~]+$")


class SignatureError(Exception):
    """A message failed verification; `reason` is a short machine-readable slug."""

    reason = "invalid-signature"


class MissingSignatureHeaders(SignatureError):
    reason = "missing-signature-headers"


class InvalidMessageId(SignatureError):
    reason = "invalid-webhook-id"


class InvalidTimestamp(SignatureError):
    reason = "invalid-timestamp"


class StaleTimestamp(SignatureError):
    reason = "stale-timestamp"


class BadSignature(SignatureError):
    reason = "bad-signature"


class InvalidSecret(ValueError):
    pass


def generate_secret(num_bytes: int = 32) -> str:
    """A new secret in the spec's text form: `whsec_` + base64 of random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(num_bytes)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_...` secret (the prefix is optional, as in the spec's libraries)."""
    text = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(text + "==", validate=False)
    except (binascii.Error, ValueError) as exc:
        raise InvalidSecret("webhook secret is not base64 after 'whsec_'") from exc
    if not key:
        raise InvalidSecret("webhook secret is empty")
    return key


def new_message_id() -> str:
    return "msg_" + secrets.token_urlsafe(18)


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value (one `v1,<sig>` entry) for this message."""
    signed = message_id.encode() + b"." + str(int(timestamp)).encode() + b"." + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode('ascii')}"


def signature_headers(
    secret: str | Sequence[str], message_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three headers a sender attaches to a signed message. Several secrets (a rotation's overlap)
    give one space-separated `v1,<sig>` entry each, as the spec lists them; a receiver on either
    secret verifies."""
    keys = [secret] if isinstance(secret, str) else list(secret)
    return {
        HEADER_ID: message_id,
        HEADER_TIMESTAMP: str(int(timestamp)),
        HEADER_SIGNATURE: " ".join(sign(one, message_id, timestamp, body) for one in keys),
    }


def has_signature_headers(headers: Mapping[str, str]) -> bool:
    lowered = {k.lower() for k in headers}
    return bool(lowered & {HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE})


def verify(
    candidate_secrets: Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
) -> tuple[str, int]:
    """Check a signed message against any of `candidate_secrets` (rotation: old and new both valid).

    Returns `(webhook-id, timestamp)`; raises a `SignatureError` subclass saying what is wrong.
    Replay protection (remembering ids) is the caller's job: it needs storage.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    message_id = lowered.get(HEADER_ID, "").strip()
    timestamp_text = lowered.get(HEADER_TIMESTAMP, "").strip()
    signature_text = lowered.get(HEADER_SIGNATURE, "").strip()
    if not (message_id and timestamp_text and signature_text):
        raise MissingSignatureHeaders(
            f"a signed request needs the {HEADER_ID}, {HEADER_TIMESTAMP} and {HEADER_SIGNATURE} headers"
        )
    if len(message_id) > MAX_MESSAGE_ID_LENGTH or not _PRINTABLE_ASCII.match(message_id):
        raise InvalidMessageId(f"{HEADER_ID} must be 1-{MAX_MESSAGE_ID_LENGTH} printable ASCII characters")
    if len(timestamp_text) > 20:
        raise InvalidTimestamp(f"{HEADER_TIMESTAMP} must be integer Unix seconds")
    try:
        timestamp = int(timestamp_text)
    except ValueError as exc:
        raise InvalidTimestamp(f"{HEADER_TIMESTAMP} must be integer Unix seconds") from exc
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise StaleTimestamp(
            f"{HEADER_TIMESTAMP} is {int(current - timestamp)} s from the server's clock "
            f"(tolerance {tolerance_s} s)"
        )
    offered: list[bytes] = []
    for entry in signature_text.split():
        version, _, value = entry.partition(",")
        if version != SIGNATURE_VERSION or not value:
            continue
        try:
            offered.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue
    if not offered:
        raise BadSignature(f"{HEADER_SIGNATURE} holds no {SIGNATURE_VERSION} signature")
    for secret in candidate_secrets:
        expected = base64.b64decode(sign(secret, message_id, timestamp, body).split(",", 1)[1])
        if any(hmac.compare_digest(expected, candidate) for candidate in offered):
            return message_id, timestamp
    raise BadSignature("no signature matches a configured secret")
