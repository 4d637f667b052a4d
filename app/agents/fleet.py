"""Concurrent calls to many agents: one shared httpx client, one `AgentClient` per engine."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import httpx

from app.agents.client import DEFAULT_CALL_TIMEOUT_S, AgentCallError, AgentClient

T = TypeVar("T")

# Requests go out as one segment each (no Nagle wait behind a delayed ACK): commit-window calls are
# latency-bound, every millisecond here is downtime.
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def new_http_client() -> httpx.AsyncClient:
    # The limits go on the transport: given a custom transport, httpx ignores the client's `limits=`
    # (and kept only 20 idle connections, so a fan-out beyond 20 agents reconnected on every call).
    # A long-poll holds a connection per agent, so keep one idle per agent and then some.
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(
            socket_options=NODELAY,
            # Idle connections expire well before the agent's 75 s keep-alive, so a reused
            # connection is never one the agent is closing at that moment.
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=256, keepalive_expiry=2.0),
        ),
    )


class Fleet:
    """The agents one job talks to. Use as an async context manager (closes the shared client)."""

    def __init__(self, *, timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._http = new_http_client()
        self._clients: dict[str, AgentClient] = {}

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def client(self, engine_id: str, url: str) -> AgentClient:
        existing = self._clients.get(engine_id)
        if existing is None or existing.base_url != url.rstrip("/"):
            existing = AgentClient(engine_id, url, http=self._http, timeout_s=self.timeout_s)
            self._clients[engine_id] = existing
        return existing

    async def each(
        self, clients: Iterable[AgentClient], call: Callable[[AgentClient], Awaitable[T]]
    ) -> dict[str, T | AgentCallError]:
        """`call` on every client at once; each result or the `AgentCallError` it raised, by engine id."""
        clients = list(clients)

        async def one(client: AgentClient) -> T | AgentCallError:
            try:
                return await call(client)
            except AgentCallError as exc:
                return exc

        results = await asyncio.gather(*(one(c) for c in clients))
        return {c.engine_id: r for c, r in zip(clients, results, strict=True)}

    async def all(
        self, clients: Iterable[AgentClient], call: Callable[[AgentClient], Awaitable[T]]
    ) -> dict[str, T]:
        """`call` on every client at once; raises the first `AgentCallError` (in client order) after
        every call has finished, so no call is left running behind the caller's back."""
        results = await self.each(clients, call)
        for result in results.values():
            if isinstance(result, AgentCallError):
                raise result
        return {k: v for k, v in results.items() if not isinstance(v, AgentCallError)}
