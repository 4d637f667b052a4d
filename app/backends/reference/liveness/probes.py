"""The I/O probes behind the judge: is an engine's process gone (the `gone` rule)? Only a refused
connection says so (nothing listens there); a slow or frozen engine, or one whose TLS certificate fails
verification (a listener answered the handshake), is not gone: the heartbeat timeout decides. And does a
freeze suspect answer at all (`reply_of`, the `frozen` rule's own probe, issue 39)?"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable

import httpx

from app.agents.transport import agent_ssl_context
from app.backends.reference.liveness.view import Reply

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


# A freeze suspect's /healthz: a live agent answers in milliseconds, a loaded host's in a few hundred (its
# HTTP server is not its serving loop); a SIGSTOPped one never does (the kernel accepts, nobody reads).
SUSPECT_TIMEOUT_S = 1.0

Reply_of = Callable[[str], Awaitable[Reply]]


async def reply_of(url: str) -> Reply:
    """What a freeze suspect at `url` answers: any HTTP answer, none within the deadline, or a refusal."""
    async with httpx.AsyncClient(timeout=SUSPECT_TIMEOUT_S, verify=agent_ssl_context()) as client:
        try:
            await client.get(f"{url.rstrip('/')}/healthz")
        except httpx.ConnectError as exc:
            return Reply.answered if _tls_failure(exc) else Reply.gone
        except httpx.HTTPError:
            return Reply.silent
    return Reply.answered


def _tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
