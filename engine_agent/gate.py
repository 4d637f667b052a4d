"""The agent's front gate: a pure ASGI middleware that decides every call from its headers before
routing, and before one byte of its body is read.

1. What the path needs (`need_of`): open (liveness, metrics, the API docs), the data key
   (`/v1/infer`), the control key (every other path, unknown ones too: a stranger learns no route),
   or the *current* control key (`POST /v1/agent-key`).
2. A client address out of failed attempts (`engine_agent.throttle.FailureThrottle`) is answered 429
   with `Retry-After`, unless the key it sends already worked from that address. A route open to
   anyone here (`/v1/infer` without a data key, every route of an agent started insecure) is never
   throttled: serving does not wait behind a guesser's failures.
3. A wrong or missing key is a 401 problem, counted in `epctl_agent_auth_failures` and summed up in
   the log (`engine_agent.throttle.RefusalLog`: a few lines, not one per call). Refusals close the
   connection: a body sent with a refused call is never read (the server holds at most its read buffer
   of it), so anonymous bodies cannot grow the agent's memory.
4. A control body is read whole, within its bound (`MAX_CONTROL_BODY_BYTES`, a prepare's
   `MAX_PREPARE_BODY_BYTES`), refused with 413 from its Content-Length or as soon as it streams past
   the bound; the route then parses what was read. `/v1/infer` bounds its own body (its size follows
   the engine's shape).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from engine_agent.auth import (
    AUTH_HEADER,
    REFUSAL_CODES,
    SCOPE_PASSED,
    WWW_AUTHENTICATE,
    AgentKeys,
    Need,
    Plane,
    bearer_of,
    digest,
)
from engine_agent.problems import PROBLEM_MEDIA_TYPE, problem_document, render_problem
from engine_agent.protocol import MAX_CONTROL_BODY_BYTES, MAX_PREPARE_BODY_BYTES
from engine_agent.throttle import FailureThrottle, RefusalLog, retry_after_header

log = logging.getLogger("engine_agent.auth")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/healthz", "/metrics", "/openapi.json", "/docs"})
OPEN_ASSETS = "/docs/static/"  # one file name under it, no deeper
DATA_PATHS = frozenset({"/v1/infer"})
CURRENT_KEY_PATHS = frozenset({"/v1/agent-key"})
BODY_BOUNDS = {"/v1/reconfig/prepare": MAX_PREPARE_BODY_BYTES}
_AUTH_HEADER = AUTH_HEADER.lower().encode()


def need_of(path: str) -> Need:
    if path in OPEN_PATHS or (path.startswith(OPEN_ASSETS) and "/" not in path[len(OPEN_ASSETS) :]):
        return Need.open
    if path in DATA_PATHS:
        return Need.data
    if path in CURRENT_KEY_PATHS:
        return Need.current
    return Need.control


def body_bound(path: str) -> int:
    return BODY_BOUNDS.get(path, MAX_CONTROL_BODY_BYTES)


@dataclass
class Guard:
    """What the gate checks against, built once the agent exists (the app's lifespan)."""

    keys: AgentKeys
    throttle: FailureThrottle = field(default_factory=FailureThrottle)
    refusals: RefusalLog = field(default_factory=lambda: RefusalLog(log))
    failures: Counter | None = None

    def register(self, registry: CollectorRegistry) -> None:
        """Count refused calls on the agent's registry (only labels: no key material)."""
        self.failures = Counter(
            "epctl_agent_auth_failures",
            "Calls refused for a missing or wrong key (or throttled after too many), by plane and reason",
            ["plane", "reason"],
            registry=registry,
        )

    def count(self, plane: Plane, reason: str) -> None:
        if self.failures is not None:
            self.failures.labels(plane=plane.value, reason=reason).inc()


class LimitExceeded(Exception):
    pass


class AgentGate:
    """The middleware (see the module doc). `guard_of` returns the `Guard`, or None while starting."""

    def __init__(self, app: ASGIApp, guard_of: Callable[[], Guard | None]) -> None:
        self.app = app
        self.guard_of = guard_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        need = need_of(path)
        if need is Need.open:
            await self.app(scope, receive, send)
            return
        guard = self.guard_of()
        if guard is None:
            await _problem(
                send, path, 503, "starting", "the agent is still starting", [(b"retry-after", b"1")]
            )
            return
        key = _presented(scope)
        client = scope["client"][0] if scope.get("client") else "unknown"
        plane = Plane.data if need is Need.data else Plane.control
        if guard.keys.accepts(need, None):
            # Open to anyone here (no data key set, or an agent started insecure): nothing to guess, so
            # nothing to throttle; serving never waits behind a guesser's failures.
            scope[SCOPE_PASSED] = need.value
            await self._pass(scope, receive, send, need, path)
            return
        presented = digest(key) if key is not None else None
        wait = guard.throttle.retry_after(client, presented)
        if wait is not None:
            guard.count(plane, "throttled")
            guard.refusals.refused(client, "throttled", f"{scope['method']} {path}")
            await _problem(
                send,
                path,
                429,
                "too-many-failed-attempts",
                "too many calls with a wrong or missing key from this address; retry later",
                [(b"retry-after", retry_after_header(wait).encode())],
            )
            return
        if not guard.keys.accepts(need, key, presented=presented):
            guard.throttle.failed(client)
            reason = "missing" if key is None else "wrong"
            guard.count(plane, reason)
            wanted = "current control" if need is Need.current else plane.value
            guard.refusals.refused(client, f"{reason} {wanted} key", f"{scope['method']} {path}")
            code = REFUSAL_CODES[plane, key is None]
            if need is Need.current and key is not None and guard.keys.accepts(Need.control, key):
                code = "agent-key-not-current"
            await _problem(
                send,
                path,
                401,
                code,
                f"this route needs the deployment's {wanted} key as Authorization: Bearer <key>",
                [(name.lower().encode(), value.encode()) for name, value in WWW_AUTHENTICATE.items()],
            )
            return
        if presented is not None:
            guard.throttle.succeeded(client, presented)
        scope[SCOPE_PASSED] = need.value
        await self._pass(scope, receive, send, need, path)

    async def _pass(self, scope: Scope, receive: Receive, send: Send, need: Need, path: str) -> None:
        """On to the app: a control body read within its bound first (`/v1/infer` bounds its own)."""
        if need is Need.data:
            await self.app(scope, receive, send)
            return
        try:
            body = await _read_bounded(scope, receive, body_bound(path))
        except LimitExceeded as exc:
            await _problem(send, path, 413, "body-too-large", str(exc))
            return
        await self.app(scope, _replay(body, receive) if body is not None else receive, send)


def _presented(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == _AUTH_HEADER:
            return bearer_of(value.decode("latin-1"))
    return None


async def _read_bounded(scope: Scope, receive: Receive, bound: int) -> bytes | None:
    """The whole body within `bound` bytes, or None when the request carries none."""
    declared: int | None = None
    chunked = False
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise LimitExceeded("Content-Length is not a number") from None
        elif name == b"transfer-encoding":
            chunked = True
    too_large = f"the body is larger than {bound} bytes (this route's bound)"
    if declared is not None and declared > bound:
        raise LimitExceeded(too_large)
    if not declared and not chunked:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > bound:
            raise LimitExceeded(too_large)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The app's `receive`: the body read already, then the server's own messages (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _problem(
    send: Send, path: str, status: int, code: str, detail: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A problem+json answer that closes the connection: a body the caller may still be sending is
    never read."""
    body = render_problem(problem_document(status=status, code=code, detail=detail, instance=path))
    headers = [
        (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
