"""Secrets at rest: `seal` before a secret goes into the database, `unseal` when it is read back.

With `EPCTL_SECRET_KEY` set (one or more Fernet keys, comma-separated; make one with
`python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`)
a value is encrypted with the first key and decrypted with any of them (MultiFernet), so a key is
rotated by putting the new one first and keeping the old one after it until every value has been
re-sealed. Without a key a value is stored in clear behind a marker, so setting a key later still
reads the old values (and seals the next ones), while a sealed value read without its key is a
clear `SealingError` rather than a garbled secret.

Stored forms: `clear:<text>` and `fernet:<token>`.
"""

from __future__ import annotations

import os
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

SECRET_KEY_ENV = "EPCTL_SECRET_KEY"
CLEAR_PREFIX = "clear:"
SEALED_PREFIX = "fernet:"


class SealingError(RuntimeError):
    """A secret that cannot be sealed or unsealed: a bad key, a missing key, a damaged value."""


@lru_cache(maxsize=4)
def _fernet_for(keys_text: str) -> MultiFernet:
    keys = [key.strip() for key in keys_text.split(",") if key.strip()]
    if not keys:
        raise SealingError(f"{SECRET_KEY_ENV} is set but holds no key")
    try:
        return MultiFernet([Fernet(key.encode()) for key in keys])
    except (ValueError, TypeError) as error:
        raise SealingError(
            f"{SECRET_KEY_ENV} holds a key that is not a Fernet key (32 url-safe base64 bytes): {error}"
        ) from None


def _fernet() -> MultiFernet | None:
    keys_text = os.environ.get(SECRET_KEY_ENV, "")
    if not keys_text.strip():
        return None
    return _fernet_for(keys_text)


def sealing_enabled() -> bool:
    """Whether `seal` encrypts (a key is configured) or stores clear text behind the marker."""
    return _fernet() is not None


def seal(text: str) -> str:
    """The stored form of `text`: encrypted with the first configured key, else marked clear."""
    fernet = _fernet()
    if fernet is None:
        return CLEAR_PREFIX + text
    return SEALED_PREFIX + fernet.encrypt(text.encode()).decode()


def unseal(stored: str) -> str:
    """The secret behind a stored form made by `seal` (with any configured key, for rotation)."""
    if stored.startswith(CLEAR_PREFIX):
        return stored[len(CLEAR_PREFIX) :]
    if stored.startswith(SEALED_PREFIX):
        fernet = _fernet()
        if fernet is None:
            raise SealingError(
                f"a secret is sealed but {SECRET_KEY_ENV} is not set: set the key that sealed it"
            )
        try:
            return fernet.decrypt(stored[len(SEALED_PREFIX) :].encode()).decode()
        except InvalidToken:
            raise SealingError(
                f"a sealed secret does not open with any key in {SECRET_KEY_ENV}: "
                "the key that sealed it is missing"
            ) from None
    raise SealingError("a stored secret carries neither the clear: nor the fernet: marker")


def opened(stored: str | None) -> str | None:
    """A stored secret in clear: sealed by `seal`, or a bare value written before that column was
    sealed (read as it is; sealed when it is next written)."""
    if stored is None:
        return None
    if stored.startswith((CLEAR_PREFIX, SEALED_PREFIX)):
        return unseal(stored)
    return stored


def reseal(stored: str) -> str:
    """`stored` under the current first key (rotation); clear text stays clear without a key."""
    fernet = _fernet()
    if fernet is None:
        return seal(unseal(stored))
    if stored.startswith(SEALED_PREFIX):
        try:
            token = fernet.rotate(stored[len(SEALED_PREFIX) :].encode())
        except InvalidToken:
            raise SealingError(f"a sealed secret does not open with any key in {SECRET_KEY_ENV}") from None
        return SEALED_PREFIX + token.decode()
    return seal(unseal(stored))
