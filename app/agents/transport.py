"""The HTTP layer under `app.agents.client.AgentClient`: the agent's paths, one aiohttp session shared
by many clients (kept-alive connections), and one agent's counted, deadlined exchanges whose failures
raise the typed errors of `app.agents.errors`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar
from urllib.parse import urlencode

import aiohttp
from pydantic import BaseModel, ValidationError
from yarl import URL

from app import metrics
from app.agents.errors import AgentDeadlineExceeded, AgentProblem, AgentSilent, AgentUnreachable, problem_type
from engine_agent.protocol import Operation
from engine_agent.tls import client_context

# The agent's HTTP paths (engine_agent/main.py serves them); a reconfiguration call's is the protocol's.
PATH_HEALTH = "/healthz"
PATH_INFO = "/v1/info"
PATH_RECONFIG = "/v1/reconfig"
PATH_PREPARE = Operation.prepare.path
PATH_SYNC = Operation.sync.path
PATH_PAUSE = Operation.pause.path
PATH_SWITCH = Operation.switch.path
PATH_ARM = Operation.arm.path
PATH_RESUME = Operation.resume.path
PATH_ABORT = Operation.abort.path
PATH_CLEANUP = "/v1/cleanup"
PATH_CLEANUP_RETRY = "/v1/cleanup/retry"
PATH_CLEANUP_ACKNOWLEDGE = "/v1/cleanup/acknowledge"
PATH_FAULTS = "/v1/faults"
PATH_INFER = "/v1/infer"
PATH_AGENT_KEY = "/v1/agent-key"
PATH_SPARE = "/v1/spare"
PATH_GENERATION_BROKEN = "/v1/generation/broken"

# The `operation` label of `epctl_agent_calls` for each path (a small, fixed set).
OPERATIONS = {
    PATH_HEALTH: "health",
    PATH_INFO: "info",
    PATH_RECONFIG: "reconfig",
    **{operation.path: operation.value for operation in Operation},
    PATH_CLEANUP: "cleanup",
    PATH_SPARE: "spare",
    PATH_CLEANUP_RETRY: "cleanup_retry",
    PATH_CLEANUP_ACKNOWLEDGE: "cleanup_acknowledge",
    PATH_FAULTS: "faults",
    PATH_INFER: "infer",
    PATH_AGENT_KEY: "agent_key",
    PATH_GENERATION_BROKEN: "generation_broken",
}

DEFAULT_CALL_TIMEOUT_S = 5.0

# Idle connections to an agent are kept this long: well inside the agent's own keep-alive (75 s), so a
# reused connection is never one the agent is closing at that moment, and long enough to span the
# gaps between a job's steps (and between the cleanup poller's rounds).
KEEPALIVE_S = 30.0

JSON_HEADERS = {"Content-Type": "application/json"}

ModelT = TypeVar("ModelT", bound=BaseModel)

_agent_ca_file: str | None = None


def use_agent_ca(ca_file: str | None) -> None:
    """The CA bundle `https://` agents are verified against from now on (the coordinator's
    `agent_ca_file`, set once as its app is built); None: the system's trust store."""
    global _agent_ca_file
    _agent_ca_file = ca_file


def agent_ssl_context() -> ssl.SSLContext:
    """The client context every call to an `https://` agent verifies its certificate with (built once
    per CA bundle; a plain `http://` agent never uses it)."""
    return client_context(_agent_ca_file)


@dataclass(frozen=True)
class AgentAnswer:
    """One HTTP answer of an agent, read in full."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes


class AgentSession:
    """One aiohttp `ClientSession` (one connection pool: a kept-alive connection per agent) shared by
    many `AgentClient`s. Opened on first use, inside the running event loop, and closed by its owner.

    aiohttp rather than httpx: httpx's cost per call grows with the connections one client holds
    (PLATFORM.md: 7.5 ms of CPU per call at 128 agents against 0.11 ms), and that cost is paid inside
    the commit window."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        # A session belongs to the loop it was opened in; a caller on another loop (a test that runs
        # one loop per step) gets its own.
        if self._session is None or self._session.closed or self._loop is not loop:
            self._loop = loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0,  # one job may talk to hundreds of agents at once
                    limit_per_host=0,
                    keepalive_timeout=KEEPALIVE_S,
                    # Agents are addressed by IP in practice; a name resolved once serves a job.
                    ttl_dns_cache=60,
                    ssl=agent_ssl_context(),
                ),
                # Per call (`ClientTimeout` on each request); the session itself imposes none.
                timeout=aiohttp.ClientTimeout(total=None),
                # Agent answers are small JSON; skip what a browser-facing client does.
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and self._loop is asyncio.get_running_loop():
            await session.close()


_last_body: tuple[BaseModel, bytes] | None = None


def encoded_body(payload: BaseModel) -> bytes:
    """A step's JSON body, serialized once per fan-out: the same request object goes to every agent,
    and prepare's lists every member (serializing it per agent grows with the square of the fleet).
    Keyed by identity, holding the payload so that identity cannot be reused meanwhile."""
    global _last_body
    cached = _last_body
    if cached is not None and cached[0] is payload:
        return cached[1]
    body = payload.model_dump_json().encode()
    _last_body = (payload, body)
    return body


class AgentTransport:
    """HTTP exchanges with one agent: deadlines, bearer token, counting, error statuses raised as
    `AgentCallError`s, answers parsed into models. Share one `AgentSession` among many for fan-out."""

    def __init__(
        self,
        engine_id: str,
        base_url: str,
        *,
        http: AgentSession | None = None,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        token: str | None = None,
        keys: Sequence[str] = (),
    ) -> None:
        """`keys`: the deployment's agent keys, current first (then the previous one, during a
        rotation's overlap: tried once on a 401 from an agent not told of the new key yet)."""
        self.engine_id = engine_id
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.keys = tuple(keys)
        self._http = http if http is not None else AgentSession()
        self._owns_http = http is None
        credential = self.keys[0] if self.keys else token
        self._headers = {"Authorization": f"Bearer {credential}"} if credential else {}
        self._json_headers = {**JSON_HEADERS, **self._headers}
        self._fallbacks = [
            ({"Authorization": f"Bearer {key}"}, {**JSON_HEADERS, "Authorization": f"Bearer {key}"})
            for key in self.keys[1:]
        ]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        answer = await self._exchange(method, path, body=body, params=params, timeout_s=timeout_s)
        return self._json(method, path, answer)

    async def _exchange(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> AgentAnswer:
        """One HTTP exchange, counted in `epctl_agent_calls`; a failure or an error status raises the
        matching `AgentCallError`."""
        outcome = "error"
        try:
            answer = await self._round_trip(method, path, body=body, params=params, timeout_s=timeout_s)
            outcome = "ok"
            return answer
        except AgentUnreachable:
            outcome = "unreachable"
            raise
        except AgentDeadlineExceeded:
            outcome = "timeout"
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"  # its waiter gave up (another engine failed first)
            raise
        finally:
            metrics.record_agent_call(OPERATIONS.get(path, "other"), outcome)

    async def _round_trip(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        params: dict[str, str] | None,
        timeout_s: float | None,
    ) -> AgentAnswer:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        # The URL built once, already encoded (our paths and parameter values need no escaping
        # beyond `urlencode`): yarl's parsing and query merging showed in the fan-out profile.
        target = self.base_url + path
        if params:
            target += "?" + urlencode(params, safe=",")
        try:
            async with asyncio.timeout(timeout):
                headers = self._json_headers if body is not None else self._headers or None
                answer = await self._send(method, target, body, headers)
                for plain, with_json in self._fallbacks:
                    if answer.status_code != 401:
                        break
                    answer = await self._send(method, target, body, with_json if body is not None else plain)
        except TimeoutError as exc:  # before ClientError: aiohttp's own timeouts are both
            raise AgentSilent(self.engine_id, f"{method} {path}: no answer within {timeout:.1f}s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise AgentUnreachable(
                self.engine_id, f"{method} {path}: {exc.__class__.__name__}: {exc}"
            ) from exc
        if answer.status_code >= 400:
            try:
                problem: Any = json.loads(answer.content)
            except ValueError:
                problem = answer.content.decode(errors="replace")
            type_, message = problem_type(problem, answer.status_code)
            raise AgentProblem(self.engine_id, answer.status_code, type_, f"{method} {path}: {message}")
        return answer

    async def _send(
        self, method: str, target: str, body: bytes | None, headers: Mapping[str, str] | None
    ) -> AgentAnswer:
        async with self._http.get().request(
            method, URL(target, encoded=True), data=body, headers=headers
        ) as response:
            return AgentAnswer(response.status, response.headers, await response.read())

    def _json(self, method: str, path: str, answer: AgentAnswer) -> Any:
        if not answer.content:
            return None
        try:
            return json.loads(answer.content)
        except ValueError as exc:
            raise AgentProblem(
                self.engine_id, answer.status_code, "bad-response", f"{method} {path}: not JSON"
            ) from exc

    def _parse(self, model: type[ModelT], body: Any, what: str) -> ModelT:
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise AgentProblem(self.engine_id, 200, "bad-response", f"{what}: {exc}") from exc

    def _parse_answer(self, model: type[ModelT], answer: AgentAnswer, what: str) -> ModelT:
        """The answer's JSON straight into the model (pydantic parses the bytes: no dict in between)."""
        try:
            return model.model_validate_json(answer.content)
        except ValidationError as exc:
            raise AgentProblem(self.engine_id, answer.status_code, "bad-response", f"{what}: {exc}") from exc
