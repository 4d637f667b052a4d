"""The reference engine's canary: one token as a binary tensor to an agent's `/v1/infer`, over one
kept-alive aiohttp session. A request stalled by a pause completes at the resume; only an answer
that is a 200 with a tensor counts."""

from __future__ import annotations

import aiohttp

from app.agents.transport import agent_ssl_context
from app.probe.canary import CANARY_HEADER, CanaryResult
from engine_agent import tensor_wire


class ReferenceCanary:
    """Implements `app.probe.Canary` for reference-engine agents (the target is an agent's URL)."""

    def __init__(self, hidden_size: int, key: str | None = None) -> None:
        """`key`: the deployment's agent key, which `/v1/infer` also accepts where the agents require
        a data key (without one it is open, and the key is sent all the same)."""
        self._body = tensor_wire.encode("float32", (1, hidden_size), bytes(4 * hidden_size))
        self._headers = {
            "content-type": tensor_wire.MEDIA_TYPE,
            "accept": tensor_wire.MEDIA_TYPE,
            CANARY_HEADER: "1",
        }
        if key:
            self._headers["authorization"] = f"Bearer {key}"
        self._session: aiohttp.ClientSession | None = None

    async def send(self, target: str) -> CanaryResult:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=agent_ssl_context()),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        try:
            url = f"{target}/v1/infer"
            async with self._session.post(url, data=self._body, headers=self._headers) as answer:
                body = await answer.read()
                if answer.status == 200 and body[:4] == tensor_wire.MAGIC:
                    return CanaryResult(ok=True, status=200)
                detail = body[:120].decode(errors="replace")
                return CanaryResult(ok=False, status=answer.status, detail=detail)
        except aiohttp.ClientError as exc:
            return CanaryResult(ok=False, detail=f"{exc.__class__.__name__}: {exc}"[:200])

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
