"""Input limits, enforced before a request is parsed, routed to a handler or authenticated.

A pure ASGI middleware in front of the app:

- the URL (path + query string) is at most `max_url_bytes`, and carries no NUL (`%00`);
- a body is at most `max_body_bytes` (a larger `Content-Length` is refused before one byte is read;
  a chunked body is cut off at the limit);
- a body that parses as JSON nests at most `max_json_depth` levels, holds integers within 64 bits,
  finite numbers only (`NaN`, `Infinity` and numbers that overflow a double are refused), and strings
  without NUL or lone surrogates (neither database stores them the same way, or at all).

Every refusal is 4xx problem+json (413, 414, 400 or 422, `code` says which limit), counted in
`epctl_requests_refused{reason}` and identical on SQLite and Postgres, since nothing reaches either.
A body that is not JSON at all is passed on: the handler's own validation answers it (422).
`/healthz` is answered here too, ahead of routing, so liveness never waits behind the app.

It also admits at most `max_active_requests` requests into the app at once; the others wait their turn
(first come, first served) holding nothing but their connection. A request leaves the gate when its
response starts (so an open event stream does not hold a place). Work per request is the same, but
the event loop never juggles hundreds of half-done requests at once, so each of its turns stays short
and `/healthz` (which skips the gate) answers promptly under any load. Past `max_waiting_requests`
waiting, a request is answered 503 with Retry-After at once.

A request whose client disconnects before its answer starts is stopped (cancelled) wherever it is:
waiting at the gate, waiting for a database slot (`app.api.database`), or between a handler's steps;
a database call already running in its worker thread finishes, and nothing after it runs. Counted in
`epctl_requests_abandoned`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from app.core.shedding import SHED, heartbeat_engine, shed_now
from app.metrics import REGISTRY
from engine_agent.problems import VALIDATION_TITLE, problem_document, render_problem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# The scope's key of a callable that lets the request leave the admission gate before its answer starts:
# for a request that holds nothing from then on but a future (a heartbeat waiting for its batch's
# commit), so that up to a batch's worth of them wait at once rather than `max_active_requests`.
LEAVE_GATE = "epctl.leave_gate"
PROBLEM_MEDIA_TYPE = b"application/problem+json"
# The scope's key of the request body's JSON document as `check_json` parsed it (`NOT_JSON`: not JSON).
JSON_BODY = "epctl.json_body"
NOT_JSON = object()
HEALTH_BODY = b'{"status":"ok"}'

ABANDONED = Counter(
    "epctl_requests_abandoned",
    "Requests whose client disconnected before their answer started: their work stopped there.",
    registry=REGISTRY,
)
REFUSED = Counter(
    "epctl_requests_refused",
    "Requests refused by the input limits before parsing or authentication, by reason.",
    ["reason"],
    registry=REGISTRY,
)


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1_048_576
    max_json_depth: int = 32
    max_url_bytes: int = 8192
    max_active_requests: int = 16
    max_waiting_requests: int = 8192
    # Heartbeats arriving while the queue is older than this are answered 503 at once (`app.core.shedding`).
    heartbeat_shed_after_s: float = 1.0
    heartbeat_retry_after_s: int = 5


class AdmissionGate:
    """At most `active` requests inside the app; the rest wait in arrival order."""

    def __init__(self) -> None:
        self.active = 0
        self.waiting: deque[tuple[float, asyncio.Future[None]]] = deque()  # (when it came, its turn)
        self.waiting_count = 0

    def queue_age_s(self) -> float:
        """How long the oldest waiting request has waited (0 when none waits)."""
        return time.monotonic() - self.waiting[0][0] if self.waiting else 0.0

    async def enter(self, limits: Limits) -> bool:
        """Wait for a place; False (at once) when too many are already waiting."""
        if self.active < limits.max_active_requests and not self.waiting_count:
            self.active += 1
            return True
        if self.waiting_count >= limits.max_waiting_requests:
            return False
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((time.monotonic(), turn))
        self.waiting_count += 1
        try:
            await turn  # the place is handed over by `leave`, already counted
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.leave()  # given a place just as we were cancelled: pass it on
            else:
                turn.cancel()
            raise
        return True

    def leave(self) -> None:
        while self.waiting:
            _, turn = self.waiting.popleft()
            self.waiting_count -= 1
            if not turn.done():
                turn.set_result(None)  # the place passes straight to the next in line
                return
        self.active -= 1


class LimitExceeded(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def _refuse_number(text: str) -> None:
    raise LimitExceeded(422, "number-out-of-range", f"the number {text[:40]!r} is not finite")


def _checked_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > 19 or not INT64_MIN <= int(text) <= INT64_MAX:
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"
        raise LimitExceeded(
            422, "integer-out-of-range", f"the integer {shown} is outside the 64-bit range this API accepts"
        )
    return int(text)


def _checked_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        _refuse_number(text)
    return value


_DECODER = json.JSONDecoder(parse_int=_checked_int, parse_float=_checked_float, parse_constant=_refuse_number)


def check_json(body: bytes, *, max_depth: int) -> Any:
    """Raise `LimitExceeded` if `body` is JSON beyond the limits; return the document if it is within
    them, `NOT_JSON` if it is not JSON at all (the handler's own parsing answers that)."""
    try:  # as `json.loads(body, parse_int=..., ...)` does, with one decoder for every request
        document = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except LimitExceeded:
        raise
    except RecursionError:
        raise LimitExceeded(
            422, "json-too-deep", f"the JSON body nests deeper than {max_depth} levels"
        ) from None
    except ValueError:  # not JSON (or not UTF-8): not ours to judge
        return NOT_JSON
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > max_depth:
                raise LimitExceeded(
                    422, "json-too-deep", f"the JSON body nests deeper than {max_depth} levels"
                )
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, value in items:
                if isinstance(key, str):
                    _check_string(key)
                stack.append((value, depth + 1))
        elif isinstance(node, str):
            _check_string(node)
    return document


def _check_string(text: str) -> None:
    if "\x00" in text:
        raise LimitExceeded(422, "invalid-characters", "a string in the body contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise LimitExceeded(
            422, "invalid-characters", "a string in the body contains a lone surrogate (\\ud800-\\udfff)"
        ) from None


class RequestLimits:
    def __init__(
        self,
        app: ASGIApp,
        limits: Limits | Callable[[], Limits],
        on_shed: Callable[[Scope, str], None] | None = None,
        backlog_age_s: Callable[[], float] | None = None,
    ) -> None:
        self.app = app
        self._limits = limits
        self._on_shed = on_shed  # told of each heartbeat shed (its scope, its engine id)
        # How long admitted heartbeats have waited for their commit (they leave the gate once queued).
        self._backlog_age_s = backlog_age_s
        # One gate per event loop: its futures belong to a loop (a server runs one; an in-process
        # test client may run one per request).
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AdmissionGate] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def gate(self) -> AdmissionGate:
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = AdmissionGate()
        return gate

    @property
    def limits(self) -> Limits:
        return self._limits() if callable(self._limits) else self._limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/healthz" and scope["method"] in ("GET", "HEAD"):
            await _respond(send, 200, b"application/json", HEALTH_BODY)
            return
        limits = self.limits
        try:
            _check_url(scope, limits)
            body = await _read_body(scope, receive, limits)
        except LimitExceeded as refused:
            await _refuse(scope, send, refused)
            return
        engine_id = heartbeat_engine(scope["method"], scope["path"])
        if engine_id is not None:
            gate = self.gate
            backlog = self._backlog_age_s() if self._backlog_age_s is not None else 0.0
            if shed_now(gate.waiting_count, gate.queue_age_s(), backlog, limits.heartbeat_shed_after_s):
                await self._shed(scope, send, engine_id, limits)
                return
        if body:
            try:  # the document kept for the heartbeat's fast path (parsed once: issue 37)
                scope[JSON_BODY] = check_json(body, max_depth=limits.max_json_depth)
            except LimitExceeded as refused:
                await _refuse(scope, send, refused)
                return
        # The body is read: the server's next message is the client's disconnect. A request whose client
        # left before its answer started is stopped where it is (waiting for a place, or for a database
        # slot, or between a handler's steps): nobody would read what it makes.
        client_gone = asyncio.Event()
        answered = False
        abandoned = False
        task = asyncio.current_task()

        async def tracked_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
            await send(message)

        def gone(_: object) -> None:
            nonlocal abandoned
            if client_gone.is_set() and not answered and task is not None and not task.done():
                abandoned = True
                task.cancel()

        # The app runs in this task (one task a request, not two and a wait: issue 37, 700 heartbeats a
        # second); the watcher cancels it where it waits once the client left unanswered.
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive, client_gone))
        watcher.add_done_callback(gone)
        try:
            await self._admitted(scope, _after_body(body, client_gone), tracked_send)
        except asyncio.CancelledError:
            if not abandoned or task is None:
                raise
            task.uncancel()
            ABANDONED.inc()
        finally:
            watcher.remove_done_callback(gone)
            watcher.cancel()

    async def _shed(self, scope: Scope, send: Send, engine_id: str, limits: Limits) -> None:
        """A heartbeat answered at once while the coordinator is saturated (`app.core.shedding`); the
        connection is kept (the body was read)."""
        SHED.inc()
        if self._on_shed is not None:
            self._on_shed(scope, engine_id)
        body = render_problem(
            problem_document(
                status=503,
                code="heartbeat-shed",
                detail="the coordinator is saturated: heartbeat heard, not recorded; send the next after "
                "Retry-After",
                instance=scope["path"],
            )
        )
        retry = [(b"retry-after", str(limits.heartbeat_retry_after_s).encode())]
        await _respond(send, 503, PROBLEM_MEDIA_TYPE, body, extra=retry)

    async def _admitted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, once the gate admits the request (a 503 problem when too many wait already)."""
        gate = self.gate
        limits = self.limits
        if not await gate.enter(limits):
            await _refuse(
                scope, send, LimitExceeded(503, "overloaded", "too many requests are waiting; retry")
            )
            return
        inside = True

        def leave_now() -> None:
            nonlocal inside
            if inside:
                inside = False
                gate.leave()

        async def send_and_leave(message: Message) -> None:
            if message["type"] == "http.response.start":
                leave_now()
            await send(message)

        # A request that only waits from here on (a heartbeat queued for its batch's commit) leaves early.
        scope[LEAVE_GATE] = leave_now

        try:
            await self.app(scope, receive, send_and_leave)
        finally:
            leave_now()


async def _wait_for_disconnect(receive: Receive, client_gone: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            client_gone.set()
            return


def _after_body(body: bytes | None, client_gone: asyncio.Event) -> Receive:
    """The app's `receive`: the body read already (empty when none), then the disconnect when it comes."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body or b"", "more_body": False}
        await client_gone.wait()
        return {"type": "http.disconnect"}

    return replay


def _check_url(scope: Scope, limits: Limits) -> None:
    raw_path = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
    query = scope.get("query_string", b"")
    if len(raw_path) + len(query) > limits.max_url_bytes:
        raise LimitExceeded(414, "uri-too-long", f"the URL is longer than {limits.max_url_bytes} bytes")
    if b"%00" in raw_path.lower() or b"%00" in query.lower() or "\x00" in scope["path"]:
        raise LimitExceeded(400, "invalid-characters", "the URL contains a NUL character (%00)")


async def _read_body(scope: Scope, receive: Receive, limits: Limits) -> bytes | None:
    """The whole body within the limit, or None for requests that carry none (GET, HEAD...)."""
    declared: int | None = None
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise LimitExceeded(400, "invalid-content-length", "Content-Length is not a number") from None
    if declared is not None and declared > limits.max_body_bytes:
        raise LimitExceeded(413, "body-too-large", f"the body is larger than {limits.max_body_bytes} bytes")
    chunked = any(name == b"transfer-encoding" for name, _ in scope.get("headers", []))
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
        if size > limits.max_body_bytes:
            raise LimitExceeded(
                413, "body-too-large", f"the body is larger than {limits.max_body_bytes} bytes"
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _refuse(scope: Scope, send: Send, refused: LimitExceeded) -> None:
    REFUSED.labels(reason=refused.code).inc()
    # The same body, title and JSON style as the app's own problem answers (`engine_agent.problems`).
    body = render_problem(
        problem_document(
            status=refused.status,
            code=refused.code,
            detail=refused.detail,
            instance=scope["path"],
            title=VALIDATION_TITLE if refused.status == 422 else None,
        )
    )
    # The body may not have been read: close the connection rather than read what we refused.
    retry = [(b"retry-after", b"1")] if refused.status == 503 else []
    await _respond(send, refused.status, PROBLEM_MEDIA_TYPE, body, close=True, extra=retry)


async def _respond(
    send: Send,
    status: int,
    media_type: bytes,
    body: bytes,
    *,
    close: bool = False,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", media_type), (b"content-length", str(len(body)).encode()), *(extra or [])]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
