"""The coordinator's client of one engine agent (async httpx).

One method per agent call, each with a deadline. Failures become typed exceptions that carry the
engine id, a machine-readable type and a message, so the runner can record
`{phase, engine_id, type, message}` without looking at HTTP:

- `AgentUnreachable`: the connection failed (the agent is down or not listening);
- `AgentDeadlineExceeded`: no answer within the call's deadline, or `wait_for_phase` ran out of time;
- `AgentProblem`: the agent answered with an error (problem+json: its `type` and `detail`);
- `AgentPhaseFailed`: the reconfiguration the agent runs ended in a phase other than the one awaited
  (failed, aborted, ...); carries the agent's `ReconfigStatus`.

Long operations answer 202 with the agent's `ReconfigStatus`: at once, or, given `wait_s`, once the
step's own phase is reached (one exchange per step). `watch` is one bounded long-poll of
`GET /v1/reconfig`; `wait_for_phase` repeats it until the phase the caller waits for. An agent that
does not mark its answers with `LONG_POLL_HEADER` (an older agent) is polled instead, as before.
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
    LONG_POLL_HEADER,
    MAX_WAIT_S,
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
        # Whether the agent holds answers for `wait_s` (None: not known yet). Learnt from its answers.
        self.long_poll: bool | None = None
        # The agent's answer to the last reconfiguration step sent to it (a waiter can start from it).
        self.last_step_status: ReconfigStatus | None = None

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
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        response = await self._exchange(method, path, json=json, params=params, timeout_s=timeout_s)
        return self._json(method, path, response)

    async def _exchange(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """One HTTP exchange; a failure or an error status raises the matching `AgentCallError`."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        url = self.base_url + path
        try:
            response = await asyncio.wait_for(
                self._client().request(
                    method, url, json=json, params=params, headers=self._headers, timeout=timeout
                ),
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
        return response

    def _json(self, method: str, path: str, response: httpx.Response) -> Any:
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

    def _learn_long_poll(self, response: httpx.Response) -> None:
        self.long_poll = LONG_POLL_HEADER in response.headers

    async def _step(
        self, path: str, payload: BaseModel, timeout_s: float | None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        """POST one step. With `wait_s` the agent answers once the step's phase is reached (or failed),
        at most `wait_s` (capped at `MAX_WAIT_S`) later; the call's deadline grows by that wait."""
        body = payload.model_dump(mode="json")
        wait = min(wait_s, MAX_WAIT_S) if self.long_poll is not False else 0.0
        if wait > 0:
            timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait
            try:
                response = await self._exchange(
                    "POST", path, json=body, params={"wait_s": f"{wait:.3f}"}, timeout_s=timeout
                )
            except AgentProblem as exc:
                if exc.status_code not in (400, 422):
                    raise
                # Perhaps an agent that refuses the parameter: send the step as before, and poll.
                response = await self._exchange("POST", path, json=body, timeout_s=timeout_s)
                self.long_poll = False
            else:
                self._learn_long_poll(response)
        else:
            response = await self._exchange("POST", path, json=body, timeout_s=timeout_s)
        status = self._parse(ReconfigStatus, self._json("POST", path, response), path)
        self.last_step_status = status
        return status

    async def prepare(
        self, request: PrepareRequest, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_PREPARE, request, timeout_s, wait_s)

    async def sync(
        self, job_id: str, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_SYNC, JobRef(job_id=job_id), timeout_s, wait_s)

    async def pause(
        self,
        job_id: str,
        *,
        lease_s: float | None = None,
        timeout_s: float | None = None,
        wait_s: float = 0.0,
    ) -> ReconfigStatus:
        return await self._step(PATH_PAUSE, PauseRequest(job_id=job_id, lease_s=lease_s), timeout_s, wait_s)

    async def switch(
        self, job_id: str, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_SWITCH, JobRef(job_id=job_id), timeout_s, wait_s)

    async def resume(
        self, job_id: str, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_RESUME, JobRef(job_id=job_id), timeout_s, wait_s)

    async def abort(
        self, job_id: str, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_ABORT, JobRef(job_id=job_id), timeout_s, wait_s)

    async def watch(
        self,
        job_id: str,
        phases: Collection[ReconfigPhase],
        *,
        wait_s: float,
        timeout_s: float | None = None,
    ) -> ReconfigStatus | None:
        """One bounded long-poll: job `job_id`'s status once it is in one of `phases`, terminal or
        failed, or after `wait_s`. None while the agent has no such job (none, or another one).

        An agent known not to hold answers (`long_poll` False) is asked plainly (answers at once)."""
        wait = min(wait_s, MAX_WAIT_S)
        if self.long_poll is False or wait <= 0:
            status = await self.reconfig(timeout_s=timeout_s)
            return status if status is not None and status.job_id == job_id else None
        params = {"job_id": job_id, "wait_s": f"{wait:.3f}"}
        if phases:
            params["until"] = ",".join(sorted(p.value for p in phases))
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait
        try:
            response = await self._exchange("GET", PATH_RECONFIG, params=params, timeout_s=timeout)
        except AgentProblem as exc:
            if exc.status_code in (404, 409):
                return None  # no job here, or another job
            if exc.status_code in (400, 422):
                self.long_poll = False
                return await self.watch(job_id, phases, wait_s=0.0, timeout_s=timeout_s)
            raise
        self._learn_long_poll(response)
        status = self._parse(ReconfigStatus, self._json("GET", PATH_RECONFIG, response), "reconfig")
        return status if status.job_id == job_id else None

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
        """Long-poll (or, for an agent that cannot, poll) `GET /v1/reconfig` until the agent's
        reconfiguration `job_id` reaches one of `phases`.

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
            held = False  # the agent held this answer (a long-poll): no pause before the next one
            try:
                status = await self.watch(
                    job_id,
                    wanted,
                    wait_s=remaining,
                    timeout_s=min(self.timeout_s, max(remaining, 0.1)),
                )
                held = status is not None and bool(self.long_poll)
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
            if held:
                continue
            await asyncio.sleep(min(poll_interval_s, max(give_up_at - time.monotonic(), 0)))
