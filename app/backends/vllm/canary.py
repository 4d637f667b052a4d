"""vLLM's canary: a 1-token `/v1/completions` request, over one kept-alive aiohttp session."""

from __future__ import annotations

import aiohttp

from app.backends.vllm.client import SCALING_MARKER
from app.probe.canary import CANARY_HEADER, CanaryResult


class VllmCanary:
    """Implements `app.probe.Canary` for a vLLM server (the target is its base URL)."""

    def __init__(self, model: str, *, api_key: str | None = None, prompt: str = "Hello") -> None:
        self.model = model
        self.prompt = prompt
        self._headers = {CANARY_HEADER: "1"}  # a front door counts it apart from clients' requests
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None

    async def send(self, target: str) -> CanaryResult:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        body = {"model": self.model, "prompt": self.prompt, "max_tokens": 1, "temperature": 0}
        try:
            async with self._session.post(f"{target}/v1/completions", json=body) as response:
                text = await response.text()
                if response.status == 200:
                    return CanaryResult(ok=True, status=200)
                detail = "scaling" if response.status == 503 and SCALING_MARKER in text else text[:120]
                return CanaryResult(ok=False, status=response.status, detail=detail)
        except aiohttp.ClientError as exc:
            return CanaryResult(ok=False, detail=f"{exc.__class__.__name__}: {exc}"[:200])

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
