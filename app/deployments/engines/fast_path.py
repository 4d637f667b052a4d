"""The steady heartbeat answered ahead of FastAPI's routing, dependencies and validation (issue 37).

2,048 engines heartbeat 683 times a second, and at that rate FastAPI's request handling (routing, a
`Request`, solving the dependencies, validating, serializing) cost more CPU than recording the
heartbeat. `HeartbeatFastPath` is an ASGI middleware just inside the input limits (`app.core.limits`:
the URL and body limits, the JSON checks, shedding, the admission gate and the client-disconnect
cancel all still apply): for `POST /v1/engines/{engine_id}/heartbeat` it answers the common case
itself, with the same code the route runs for it (`steady_answer`), and passes every other request on
untouched. The common case is narrow on purpose: a well-formed engine id, a JSON body that validates
as `EngineHeartbeat`, a token this coordinator found valid within `auth_cache_s` with the engines'
permission and not throttled from this address (the same check `app.api.deps.get_principal` makes
with its cache), and a heartbeat the batch writer records (`batch.HeartbeatBatches`: a steady one). Anything
else (no or unknown token, a 401/403/422/429, a broken group, an engine the batch cannot take) goes to
the FastAPI route, which answers it as it always did; an engine the batch could not take is marked in
the scope (`WHOLE_PATH`), so the route goes straight to the whole path instead of trying the batch
again. The answer's bytes, headers and metrics labels are the route's (tested against it).

Once queued for its batch, a heartbeat leaves the admission gate (`steady_answer`): one the batch then
hands back (its engine unknown, its key verdict moving: rare) takes the whole path outside the gate,
its database work still bounded by the request database slots (`app.api.database`).
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from fastapi import FastAPI
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.database import Database
from app.api.params import ENGINE_ID_PATTERN
from app.core.auth import Permission
from app.core.clock import utc_now
from app.core.limits import JSON_BODY, LEAVE_GATE, NOT_JSON
from app.core.shedding import heartbeat_engine
from app.core.stuck import STUCK
from app.deployments.engines.batch import HeartbeatBatches
from app.deployments.engines.models import EngineHeartbeat, EngineHeartbeatAnswer
from app.tokens.service import hash_token

WHOLE_PATH = "epctl.heartbeat_whole_path"  # scope key: the batch could not take this heartbeat
_ENGINE_ID = re.compile(ENGINE_ID_PATTERN)
_JSON = b"application/json"


def batches_of(state: Any, database: Database) -> HeartbeatBatches:
    """The app's steady-heartbeat writer (made on first use, on the app's database)."""
    batches: HeartbeatBatches | None = getattr(state, "heartbeat_batches", None)
    if batches is None or batches.database is not database:
        batches = state.heartbeat_batches = HeartbeatBatches(database)
    return batches


async def steady_answer(
    state: Any, database: Database, engine_id: str, heartbeat: EngineHeartbeat, scope: Scope
) -> EngineHeartbeatAnswer | None:
    """A heartbeat that only renews its engine's record, written with the others waiting (one commit
    for all) and answered once committed; None when it needs the whole path (`service.record_heartbeat`),
    with nothing written that the whole path would not write. The route and the fast path both call this.
    Once queued for its batch the request leaves the admission gate (`LEAVE_GATE`): it holds nothing but
    a future, and the gate's 16 places would otherwise cap a batch at 16 heartbeats."""
    recorded = await batches_of(state, database).record(engine_id, heartbeat, on_queued=scope.get(LEAVE_GATE))
    if recorded is None:
        return None
    return answer_of(recorded.row, recorded.coordinators)


def answer_of(row: Any, coordinators: list[str]) -> EngineHeartbeatAnswer:
    """`EngineHeartbeatAnswer.of(row, ...)`, validated from the row's mapping: pydantic reads a dict in its
    own code, where `of` reads every field through a Python attribute lookup (a tenth of a heartbeat's
    CPU at 1,024 engines: issue 37). Tested equal to `of`."""
    values = dict(row._mapping)
    values["deployment"] = row.deployment or ""
    values["coordinators"] = coordinators
    return EngineHeartbeatAnswer.model_validate(values)


def render(answer: EngineHeartbeatAnswer) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body FastAPI sends for the route's answer (its `JSONResponse` of the model)."""
    body = answer.model_dump_json(by_alias=True).encode()
    return [(b"content-length", str(len(body)).encode()), (b"content-type", _JSON)], body


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def _trusted(app: FastAPI, scope: Scope) -> bool:
    """Whether `get_principal` would take the request's token from its cache with the engines' permission,
    not throttled: then it records the token's success from this address, as `get_principal` does.
    False (nothing recorded) for anything else: the route authenticates it."""
    state = app.state
    cache, guard = getattr(state, "principal_cache", None), getattr(state, "auth_guard", None)
    if cache is None or guard is None:
        return False
    authorization = _header(scope, b"authorization")
    if authorization is None:
        return False
    scheme, secret = get_authorization_scheme_param(authorization.decode("latin-1"))  # as HTTPBearer
    if scheme.lower() != "bearer" or not secret:
        return False
    secret_hash = hash_token(secret)
    client = scope["client"][0] if scope.get("client") else "unknown"
    if guard.throttle.retry_after(client, secret_hash.encode()) is not None:
        return False
    principal = cache.get(secret_hash)
    if principal is None or not principal.can(Permission.engines):
        return False
    guard.throttle.succeeded(client, secret_hash.encode())
    return True


def _validated(scope: Scope, body: bytes) -> EngineHeartbeat | None:
    content_type = _header(scope, b"content-type")
    if content_type is not None and content_type != _JSON:
        return None  # FastAPI's own reading of other media types decides
    document = scope.get(JSON_BODY, None)  # as the input limits parsed it, when they did
    try:
        if document is None or document is NOT_JSON:
            document = json.loads(body)
        return EngineHeartbeat.model_validate(document)
    except (ValueError, ValidationError):  # not JSON, or not a valid heartbeat: the route's 422
        return None


class HeartbeatFastPath:
    """ASGI middleware: the steady heartbeat answered without FastAPI (the module's doc)."""

    def __init__(self, app: ASGIApp, *, route: BaseRoute | None = None, enabled: Any = True) -> None:
        self.app = app
        self._route = route  # the FastAPI route's own object: in the scope, as routing puts it (metrics)
        self._enabled = enabled  # a bool, or a callable read per request (the settings resolve at start-up)

    def enabled(self) -> bool:
        return bool(self._enabled() if callable(self._enabled) else self._enabled)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        engine_id = heartbeat_engine(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if engine_id is None or not self.enabled() or not _ENGINE_ID.fullmatch(engine_id):
            await self.app(scope, receive, send)
            return
        app: FastAPI = scope["app"]
        database: Database | None = getattr(app.state, "database", None)
        body, replay = await _read(receive)
        heartbeat = None
        if database is not None and _trusted(app, scope):
            heartbeat = _validated(scope, body)
        # A stuck report (issue 39: rare, and judged at once) is the route's, for its note and wake.
        if database is None or heartbeat is None or heartbeat.stuck_generation is not None:
            await self.app(scope, replay, send)
            return
        STUCK.note(engine_id, None, None, [], utc_now())  # a heartbeat without one ends the engine's report
        try:
            answer = await steady_answer(app.state, database, engine_id, heartbeat, scope)
        except Exception as exc:  # answered by the app's own handler, as the route's would be
            await self._failed(app, scope, replay, send, exc)
            return
        if answer is None:
            scope[WHOLE_PATH] = True
            await self.app(scope, replay, send)
            return
        scope["route"] = self._route  # the metrics' route label, as routing sets it
        headers, payload = render(answer)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _failed(self, app: FastAPI, scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
        """The exception answered as the route's would be: by the app's handler for its type (the
        problem+json of `app.core.problems`); one that only the last-resort handler takes is raised on,
        to the server-error middleware, as from the route."""
        for kind in type(exc).__mro__:
            if kind is Exception:
                break
            handler = app.exception_handlers.get(kind)
            if handler is not None:
                scope["route"] = self._route
                response = handler(Request(scope, receive), exc)
                if inspect.isawaitable(response):
                    response = await response
                await response(scope, receive, send)
                return
        raise exc


async def _read(receive: Receive) -> tuple[bytes, Receive]:
    """The request's body, and a `receive` that gives the same messages again, then the server's next."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")

    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return body, replay
