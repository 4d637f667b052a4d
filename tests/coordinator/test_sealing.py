"""Secrets at rest: clear behind a marker without a key, Fernet with one, rotation, clear errors."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from app.core.sealing import SECRET_KEY_ENV, SealingError, reseal, seal, unseal


def test_without_a_key_a_secret_is_stored_clear_behind_the_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_KEY_ENV, raising=False)
    stored = seal("whsec_abc")
    assert stored == "clear:whsec_abc"
    assert unseal(stored) == "whsec_abc"


def test_with_a_key_a_secret_is_encrypted_and_rotation_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    monkeypatch.delenv(SECRET_KEY_ENV, raising=False)
    clear = seal("before-any-key")
    monkeypatch.setenv(SECRET_KEY_ENV, old)
    sealed = seal("whsec_abc")
    assert sealed.startswith("fernet:") and "whsec_abc" not in sealed
    assert unseal(sealed) == "whsec_abc"
    assert unseal(clear) == "before-any-key"  # a key set later still reads the old values
    monkeypatch.setenv(SECRET_KEY_ENV, f"{new},{old}")
    assert unseal(sealed) == "whsec_abc"  # the previous key still decrypts during rotation
    resealed = reseal(sealed)
    monkeypatch.setenv(SECRET_KEY_ENV, new)
    assert unseal(resealed) == "whsec_abc"
    with pytest.raises(SealingError, match="does not open"):
        unseal(sealed)  # sealed under the old key only, which is gone


def test_a_sealed_secret_without_its_key_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_KEY_ENV, Fernet.generate_key().decode())
    sealed = seal("s")
    monkeypatch.delenv(SECRET_KEY_ENV)
    with pytest.raises(SealingError, match="not set"):
        unseal(sealed)
    monkeypatch.setenv(SECRET_KEY_ENV, "not-a-key")
    with pytest.raises(SealingError, match="not a Fernet key"):
        seal("s")
    with pytest.raises(SealingError, match="marker"):
        unseal("plain")
