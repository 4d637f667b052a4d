"""Sortable identifiers: a prefix plus 26 Crockford base32 characters (48-bit ms time + 80 random bits),
monotonic within one process, so ids sort by creation time."""

from __future__ import annotations

import secrets
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_lock = threading.Lock()
_last_ms = 0
_last_random = 0


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


def new_ulid() -> str:
    global _last_ms, _last_random
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            now_ms = _last_ms
            _last_random += 1  # same millisecond: keep order by counting up
        else:
            _last_ms = now_ms
            _last_random = secrets.randbits(79)  # headroom so counting up never overflows 80 bits
        return _encode(now_ms, 10) + _encode(_last_random, 16)


def new_id(prefix: str) -> str:
    return f"{prefix}_{new_ulid().lower()}"
