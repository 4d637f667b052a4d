"""Standard Webhooks signing, cross-checked against the spec's own `standardwebhooks` package."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.webhooks import signing


def test_generated_secret_has_whsec_prefix_and_32_random_bytes() -> None:
    secret = signing.generate_secret()
    assert secret.startswith("whsec_")
    assert len(signing.secret_key(secret)) == 32
    assert secret != signing.generate_secret()


def test_our_signature_verifies_with_the_reference_library() -> None:
    secret = signing.generate_secret()
    body = b'{"type":"reconfiguration.started","timestamp":"2026-11-29T10:00:00Z","data":{}}'
    now = int(time.time())
    headers = signing.signature_headers(secret, "msg_1", now, body)
    assert Webhook(secret).verify(body, headers) == {
        "type": "reconfiguration.started",
        "timestamp": "2026-11-29T10:00:00Z",
        "data": {},
    }


def test_reference_library_signature_verifies_with_ours() -> None:
    secret = signing.generate_secret()
    body = b'{"deployment":"d1","target_dp_size":3}'
    now = int(time.time())
    reference = Webhook(secret).sign("msg_x", datetime.fromtimestamp(now, tz=UTC), body.decode())
    headers = {"Webhook-Id": "msg_x", "Webhook-Timestamp": str(now), "Webhook-Signature": reference}
    assert signing.verify([secret], headers, body) == ("msg_x", now)


def test_tampered_body_is_a_bad_signature_for_both_implementations() -> None:
    secret = signing.generate_secret()
    now = int(time.time())
    headers = signing.signature_headers(secret, "msg_1", now, b'{"target_dp_size":3}')
    with pytest.raises(signing.BadSignature):
        signing.verify([secret], headers, b'{"target_dp_size":9}')
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(b'{"target_dp_size":9}', headers)


def test_any_of_several_secrets_verifies_so_rotation_works() -> None:
    old, new = signing.generate_secret(), signing.generate_secret()
    now = int(time.time())
    headers = signing.signature_headers(old, "msg_1", now, b"{}")
    assert signing.verify([new, old], headers, b"{}")[0] == "msg_1"


def test_multiple_space_separated_signatures_are_accepted_if_one_matches() -> None:
    secret = signing.generate_secret()
    now = int(time.time())
    good = signing.sign(secret, "msg_1", now, b"{}")
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(now), "webhook-signature": f"v1,AAAA {good}"}
    assert signing.verify([secret], headers, b"{}")[0] == "msg_1"


def test_timestamp_older_than_five_minutes_is_stale() -> None:
    secret = signing.generate_secret()
    now = time.time()
    headers = signing.signature_headers(secret, "msg_1", int(now) - 301, b"{}")
    with pytest.raises(signing.StaleTimestamp):
        signing.verify([secret], headers, b"{}", now=now)


def test_timestamp_from_the_future_is_stale_too() -> None:
    secret = signing.generate_secret()
    now = time.time()
    headers = signing.signature_headers(secret, "msg_1", int(now) + 301, b"{}")
    with pytest.raises(signing.StaleTimestamp):
        signing.verify([secret], headers, b"{}", now=now)


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({}, signing.MissingSignatureHeaders),
        (
            {"webhook-id": "m", "webhook-timestamp": "abc", "webhook-signature": "v1,AA=="},
            signing.InvalidTimestamp,
        ),
        (
            {"webhook-id": "m", "webhook-timestamp": "NOW", "webhook-signature": "v2,AA=="},
            signing.BadSignature,
        ),
        (
            {"webhook-id": "m", "webhook-timestamp": "NOW", "webhook-signature": "v1,!!!"},
            signing.BadSignature,
        ),
    ],
)
def test_malformed_headers_are_refused_with_a_specific_error(
    headers: dict[str, str], error: type[signing.SignatureError]
) -> None:
    headers = {k: v.replace("NOW", str(int(time.time()))) for k, v in headers.items()}
    with pytest.raises(error):
        signing.verify([signing.generate_secret()], headers, b"{}")


def test_secret_that_is_not_base64_is_refused() -> None:
    with pytest.raises(signing.InvalidSecret):
        signing.secret_key("whsec_")
