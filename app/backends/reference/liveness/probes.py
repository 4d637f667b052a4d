"""The I/O probe behind the judge's `gone` rule: is an engine's process gone? Only a refused connection
says so (nothing listens there); a slow or frozen engine, or one whose TLS certificate fails
verification (a listener answered the handshake), is not gone: the heartbeat timeout decides."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable

import httpx

from app.agents.transport import agent_ssl_context

PROBE_TIMEOUT_S = 1.0  # a suspect's /healthz: only a refused connection counts, never a slow answer

Probe = Callable[[str], Awaitable[bool]]  # an engine URL -> whether its process is gone


async def process_gone(url: str) -> bool:
    """True when nothing listens at `url` (connection refused); a slow or frozen engine is not gone."""
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, verify=agent_ssl_context()) as client:
        try:
            await client.get(f"{url.rstrip('/')}/healthz")
        except httpx.ConnectError as exc:
            # A TLS handshake that failed (a certificate not the operator's CA's) reached a listener.
            return not _tls_failure(exc)
        except httpx.HTTPError:
            return False  # the heartbeat timeout decides
    return False


def _tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
