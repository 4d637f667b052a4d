"""The coordinator's client of one engine agent (async httpx).

One method per agent call, each with a deadline. Failures become typed exceptions that carry the
engine id, a machine-readable type and a message, so the runner can record
`{phase, engine_id, type, message}` without looking at HTTP:

- `AgentUnreachable`: the connection failed (the agent is down or not listening);
- `AgentDeadlineExceeded`: no answer within the call's deadline, or `wait_for_phase` ran out of time;
- `AgentProblem`: the agent answered with an error (problem+json: its `type` and `detail`);
- `AgentPhaseFailed`: the reconfiguration the agent runs ended in a phase other than the one awaited
  (failed, aborted, ...); carries the agent's `ReconfigStatus`.

Long operations answer 202 at once with the agent's `ReconfigStatus`; `wait_for_phase` polls
`GET /v1/reconfig` until the phase the caller waits for.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from engine_agent.protocol import (
    TERMINAL_PHASES,
    AgentInfo,
    CleanupStatus,
    FaultInjection,
    InferRequest,
    InferResponse,
    JobRef,
    PauseRequest,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
)

# The agent's HTTP paths (engine_agent/main.py serves them).
PATH_HEALTH = "/healthz"
PATH_INFO = "/v1/info"
PATH_RECONFIG = "/v1/reconfig"
PATH_PREPARE = "/v1/reconfig/prepare"
PATH_SYNC = "/v1/reconfig/sync"
PATH_PAUSE = "/v1/reconfig/pause"
PATH_SWITCH = "/v1/reconfig/switch"
PATH_RESUME = "/v1/reconfig/resume"
PATH_ABORT = "/v1/reconfig/abort"
PATH_CLEANUP = "/v1/cleanup"
PATH_CLEANUP_RETRY = "/v1/cleanup/retry"
PATH_CLEANUP_ACKNOWLEDGE = "/v1/cleanup/acknowledge"
PATH_FAULTS = "/v1/faults"
PATH_INFER = "/v1/infer"

DEFAULT_CALL_TIMEOUT_S = 5.0

ModelT = TypeVar("ModelT", bound=BaseModel)


class AgentCallError(Exception):
    """A call to one agent failed."""

    type: str = "agent_error"

    def __init__(self, engine_id: str, message: str, *, type_: str | None = None) -> None:
        super().__init__(f"{engine_id}: {message}")
        self.engine_id = engine_id
        self.message = message
        if type_ is not None:
            self.type = type_

    def as_error(self, phase: str | None = None) -> dict[str, Any]:
        """The job's error record."""
        return {"phase": phase, "engine_id": self.engine_id, "type": self.type, "message": self.message}


class AgentUnreachable(AgentCallError):
    type = "agent_unreachable"


class AgentDeadlineExceeded(AgentCallError):
    type = "deadline_exceeded"


class AgentProblem(AgentCallError):
    """The agent answered with an HTTP error; `type` is the problem's type (or `http_<status>`)."""

    def __init__(self, engine_id: str, status_code: int, type_: str, message: str) -> None:
        super().__init__(engine_id, message, type_=type_)
        self.status_code = status_code


class AgentPhaseFailed(AgentCallError):
    """The agent's reconfiguration ended somewhere other than the phase awaited."""

    def __init__(self, engine_id: str, status: ReconfigStatus, expected: Collection[ReconfigPhase]) -> None:
        if status.error is not None:
            type_, message = status.error.type, status.error.message
            if status.error.step:
                message = f"{message} (at {status.error.step})"
        else:
            type_ = f"unexpected_phase_{status.phase.value}"
            wanted = "/".join(p.value for p in expected)
            message = f"reached {status.phase.value} while waiting for {wanted}"
        super().__init__(engine_id, message, type_=type_)
        self.status = status


def _problem_type(body: Any, status_code: int) -> tuple[str, str]:
    """(type, message) from a problem+json body, tolerant of plain FastAPI errors."""
    if isinstance(body, dict):
        raw_type = body.get("type")
        type_ = str(raw_type) if raw_type and raw_type != "about:blank" else f"http_{status_code}"
        # Problem types may be URIs; keep their last segment as the short machine name.
        type_ = type_.rstrip("/").rsplit("/", 1)[-1]
        message = body.get("detail") or body.get("title") or body.get("message")
        if message is None and "error" in body:
            message = body["error"]
        return type_, str(message if message is not None else body)
    return f"http_{status_code}", str(body)


class AgentClient:
    """Calls to one agent. Share one `httpx.AsyncClient` among many of these for fan-out."""

    def __init__(
        self,
        engine_id: str,
        base_url: str,
        *,
        http: httpx.AsyncClient | None = None,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        token: str | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = http
        self._owns_http = http is None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(
                    socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
                )
            )
        return self._http

    async def _request(
        self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None
    ) -> Any:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        url = self.base_url + path
        try:
            response = await asyncio.wait_for(
                self._client().request(method, url, json=json, headers=self._headers, timeout=timeout),
                timeout=timeout + 0.5,
            )
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise AgentUnreachable(
                self.engine_id, f"{method} {path}: {exc.__class__.__name__}: {exc}"
            ) from exc
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise AgentDeadlineExceeded(
                self.engine_id, f"{method} {path}: no answer within {timeout:.1f}s"
            ) from exc
        except httpx.HTTPError as exc:
            raise AgentUnreachable(
                self.engine_id, f"{method} {path}: {exc.__class__.__name__}: {exc}"
            ) from exc
        if response.status_code >= 400:
            try:
                body: Any = response.json()
            except ValueError:
                body = response.text
            type_, message = _problem_type(body, response.status_code)
            raise AgentProblem(self.engine_id, response.status_code, type_, f"{method} {path}: {message}")
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise AgentProblem(
                self.engine_id, response.status_code, "bad_response", f"{method} {path}: not JSON"
            ) from exc

    def _parse(self, model: type[ModelT], body: Any, what: str) -> ModelT:
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise AgentProblem(self.engine_id, 200, "bad_response", f"{what}: {exc}") from exc

    # --- reads -------------------------------------------------------------------------------------

    async def health(self, *, timeout_s: float | None = None) -> bool:
        await self._request("GET", PATH_HEALTH, timeout_s=timeout_s)
        return True

    async def info(self, *, timeout_s: float | None = None) -> AgentInfo:
        return self._parse(AgentInfo, await self._request("GET", PATH_INFO, timeout_s=timeout_s), "info")

    async def reconfig(self, *, timeout_s: float | None = None) -> ReconfigStatus | None:
        """The agent's current (or last) reconfiguration; None if it has never run one."""
        try:
            body = await self._request("GET", PATH_RECONFIG, timeout_s=timeout_s)
        except AgentProblem as exc:
            if exc.status_code == 404:
                return None
            raise
        if body is None:
            return None
        return self._parse(ReconfigStatus, body, "reconfig")

    async def cleanup_status(self, *, timeout_s: float | None = None) -> CleanupStatus:
        body = await self._request("GET", PATH_CLEANUP, timeout_s=timeout_s)
        return self._parse(CleanupStatus, body, "cleanup")

    # --- reconfiguration steps (each answers 202 with the agent's status) -------------------------

    async def _step(self, path: str, payload: BaseModel, timeout_s: float | None) -> ReconfigStatus:
        body = await self._request("POST", path, json=payload.model_dump(mode="json"), timeout_s=timeout_s)
        return self._parse(ReconfigStatus, body, path)

    async def prepare(self, request: PrepareRequest, *, timeout_s: float | None = None) -> ReconfigStatus:
        return await self._step(PATH_PREPARE, request, timeout_s)

    async def sync(self, job_id: str, *, timeout_s: float | None = None) -> ReconfigStatus:
        return await self._step(PATH_SYNC, JobRef(job_id=job_id), timeout_s)

    async def pause(
        self, job_id: str, *, lease_s: float | None = None, timeout_s: float | None = None
    ) -> ReconfigStatus:
        return await self._step(PATH_PAUSE, PauseRequest(job_id=job_id, lease_s=lease_s), timeout_s)

    async def switch(self, job_id: str, *, timeout_s: float | None = None) -> ReconfigStatus:
        return await self._step(PATH_SWITCH, JobRef(job_id=job_id), timeout_s)

    async def resume(self, job_id: str, *, timeout_s: float | None = None) -> ReconfigStatus:
        return await self._step(PATH_RESUME, JobRef(job_id=job_id), timeout_s)

    async def abort(self, job_id: str, *, timeout_s: float | None = None) -> ReconfigStatus:
        return await self._step(PATH_ABORT, JobRef(job_id=job_id), timeout_s)

    async def cleanup_retry(self, *, timeout_s: float | None = None) -> CleanupStatus:
        body = await self._request("POST", PATH_CLEANUP_RETRY, timeout_s=timeout_s)
        return self._parse(CleanupStatus, body, "cleanup retry")

    async def cleanup_acknowledge(self, *, timeout_s: float | None = None) -> CleanupStatus:
        body = await self._request("POST", PATH_CLEANUP_ACKNOWLEDGE, timeout_s=timeout_s)
        return self._parse(CleanupStatus, body, "cleanup acknowledge")

    async def inject_faults(self, faults: FaultInjection, *, timeout_s: float | None = None) -> None:
        await self._request("POST", PATH_FAULTS, json=faults.model_dump(mode="json"), timeout_s=timeout_s)

    async def infer(self, tokens: list[list[float]], *, timeout_s: float | None = None) -> InferResponse:
        body = await self._request(
            "POST", PATH_INFER, json=InferRequest(tokens=tokens).model_dump(mode="json"), timeout_s=timeout_s
        )
        return self._parse(InferResponse, body, "infer")

    # --- polling ----------------------------------------------------------------------------------

    async def wait_for_phase(
        self,
        job_id: str,
        phases: Collection[ReconfigPhase],
        *,
        deadline_s: float,
        poll_interval_s: float = 0.05,
        on_status: Callable[[ReconfigStatus], None] | None = None,
    ) -> ReconfigStatus:
        """Poll `GET /v1/reconfig` until the agent's reconfiguration `job_id` reaches one of `phases`.

        Raises `AgentPhaseFailed` if it reaches a terminal phase not asked for (or reports an error),
        `AgentDeadlineExceeded` after `deadline_s`. Transient poll failures are retried until the
        deadline; the last one is raised if the deadline passes while the agent is unreachable.
        """
        wanted = frozenset(phases)
        give_up_at = time.monotonic() + deadline_s
        last_error: AgentCallError | None = None
        while True:
            remaining = give_up_at - time.monotonic()
            if remaining <= 0:
                if last_error is not None and not isinstance(last_error, AgentDeadlineExceeded):
                    raise last_error
                raise AgentDeadlineExceeded(
                    self.engine_id,
                    f"job {job_id} did not reach {'/'.join(sorted(p.value for p in wanted))} "
                    f"within {deadline_s:.1f}s",
                )
            try:
                status = await self.reconfig(timeout_s=min(self.timeout_s, max(remaining, 0.1)))
                last_error = None
            except (AgentUnreachable, AgentDeadlineExceeded) as exc:
                last_error = exc
                status = None
            if status is not None and status.job_id == job_id:
                if on_status is not None:
                    on_status(status)
                if status.phase in wanted:
                    return status
                if status.phase in TERMINAL_PHASES or status.phase == ReconfigPhase.failed:
                    raise AgentPhaseFailed(self.engine_id, status, wanted)
                if status.error is not None and status.phase not in (
                    ReconfigPhase.aborting,
                    ReconfigPhase.resuming,
                ):
                    raise AgentPhaseFailed(self.engine_id, status, wanted)
            if isinstance(last_error, AgentUnreachable) and time.monotonic() + poll_interval_s >= give_up_at:
                raise last_error
            await asyncio.sleep(min(poll_interval_s, max(give_up_at - time.monotonic(), 0)))
