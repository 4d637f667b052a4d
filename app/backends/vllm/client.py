"""The coordinator's client of one vLLM API server: health, elastic EP scaling, metrics, models, and
a completion. The API key goes on every call (vLLM checks it on `/v1/*` only, but a proxy in front of
it may check all of them).

While vLLM scales, its middleware answers 503 `{"error": "The model is currently scaling..."}` to every
route, `/health` and `/is_scaling_elastic_ep` included: `is_scaling_answer` reads such a 503 as "yes".
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from app.core.faults import EngineFault

SCALING_MARKER = "currently scaling"


class VllmCallError(EngineFault):
    """A call that got no usable answer. `type` is the job's error type."""

    type = "engine-call-failed"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class VllmUnreachable(VllmCallError):
    type = "engine-unreachable"


class VllmTimeout(VllmCallError):
    type = "engine-timeout"


class VllmAuthRejected(VllmCallError):
    type = "engine-auth-rejected"


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # parsed JSON, or the text when it is not JSON
    elapsed_ms: float

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def scaling(self) -> bool:
        """vLLM's middleware refusing the call because the engine is scaling."""
        return self.status == 503 and SCALING_MARKER in error_message(self.body)

    @property
    def message(self) -> str:
        return error_message(self.body)


def error_message(body: Any) -> str:
    """vLLM's message, whichever of its shapes: {"error": {"message": m}}, {"error": m}, {"detail": m},
    {"message": m}, or the text itself."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message") is not None:
            return str(error["message"])
        for key in ("error", "detail", "message"):
            if body.get(key) is not None:
                return str(body[key]) if not isinstance(body[key], str) else body[key]
        return json.dumps(body)[:500]
    return str(body or "")[:500]


class VllmClient:
    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout_s)

    async def __aenter__(self) -> VllmClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(
        self, method: str, path: str, *, json_body: Any = None, timeout_s: float | None = None
    ) -> Answer:
        started = time.monotonic()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            response = await self._http.request(method, path, json=json_body, timeout=timeout)
        except httpx.TimeoutException as exc:
            raise VllmTimeout(f"{method} {path}: no answer within {timeout:g}s") from exc
        except httpx.TransportError as exc:
            raise VllmUnreachable(f"{method} {self.url}{path}: {exc.__class__.__name__}: {exc}") from exc
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        return Answer(response.status_code, body, round((time.monotonic() - started) * 1000.0, 3))

    # --- the calls --------------------------------------------------------------------------------

    async def health(self) -> Answer:
        return await self.call("GET", "/health")

    async def is_scaling(self) -> bool:
        """True while vLLM scales (its own flag, or its middleware's 503); raises when it cannot tell."""
        answer = await self.call("POST", "/is_scaling_elastic_ep")
        if answer.scaling:
            return True
        if answer.ok and isinstance(answer.body, dict) and "is_scaling_elastic_ep" in answer.body:
            return bool(answer.body["is_scaling_elastic_ep"])
        raise VllmCallError(
            f"/is_scaling_elastic_ep answered {answer.status}: {answer.message}", status=answer.status
        )

    async def scale(self, new_dp_size: int, *, drain_timeout_s: int, timeout_s: float) -> Answer:
        """The blocking elastic EP call: it answers once vLLM finished (or failed) the change."""
        return await self.call(
            "POST",
            "/scale_elastic_ep",
            json_body={"new_data_parallel_size": new_dp_size, "drain_timeout": drain_timeout_s},
            timeout_s=timeout_s,
        )

    async def metrics(self) -> Answer:
        return await self.call("GET", "/metrics")

    async def models(self) -> list[str]:
        answer = await self.call("GET", "/v1/models")
        if answer.status in (401, 403):
            raise VllmAuthRejected(
                f"vLLM refused the API key ({answer.status} {answer.message}): check the deployment's "
                "vllm.api_key",
                status=answer.status,
            )
        if not answer.ok or not isinstance(answer.body, dict):
            raise VllmCallError(
                f"/v1/models answered {answer.status}: {answer.message}", status=answer.status
            )
        return [str(m.get("id")) for m in answer.body.get("data", []) if isinstance(m, dict)]

    async def complete(self, model: str, prompt: str, *, max_tokens: int = 1) -> Answer:
        return await self.call(
            "POST",
            "/v1/completions",
            json_body={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        )
