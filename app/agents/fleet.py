"""Concurrent calls to many agents: one shared aiohttp session (a kept-alive connection per agent),
one `AgentClient` per engine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

from app.agents.client import AgentClient
from app.agents.errors import AgentCallError
from app.agents.transport import DEFAULT_CALL_TIMEOUT_S, AgentSession

T = TypeVar("T")


class Fleet:
    """The agents one job talks to. Use as an async context manager. Given `session` (the runner's
    one session, so connections to the agents outlive a job), it leaves that session open; without
    one it opens and closes its own."""

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        session: AgentSession | None = None,
        keys: Sequence[str] = (),
    ) -> None:
        self.timeout_s = timeout_s
        self.keys = tuple(keys)  # agent keys for clients made without their own
        self._http = session if session is not None else AgentSession()
        self._owns_http = session is None
        self._clients: dict[str, AgentClient] = {}

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    def client(self, engine_id: str, url: str, keys: Sequence[str] | None = None) -> AgentClient:
        """`keys`: the deployment's agent keys, current first (default: the fleet's `keys`)."""
        wanted = tuple(self.keys if keys is None else keys)
        existing = self._clients.get(engine_id)
        if existing is None or existing.base_url != url.rstrip("/") or existing.keys != wanted:
            existing = AgentClient(engine_id, url, http=self._http, timeout_s=self.timeout_s, keys=wanted)
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
