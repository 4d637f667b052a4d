"""Who may call the agent: the deployment's agent key for every control route, an optional data key
for `/v1/infer`. Both travel as `Authorization: Bearer <key>`.

The agent keeps only the keys' SHA-256 digests and compares digests with `hmac.compare_digest`
(constant time). A previous key always has an end: during a rotation it is accepted until its overlap
ends (`EPCTL_AGENT_KEY_PREVIOUS_UNTIL` at start, the push's `overlap_s` after), then never again, on
every route. Only the *current* key may rotate the key (`POST /v1/agent-key`), so a rotated-out key can
never take the engine away from the coordinator. `/healthz`, `/metrics` and the API docs stay open;
every other route needs a key.

The check itself runs in `engine_agent.gate`, an ASGI middleware in front of routing: from the headers
alone, before any body is read. The route dependencies here document the schemes in the OpenAPI
document and check that the gate passed the call.

An agent started without a key refuses to start, unless started with `--insecure-no-agent-key`
(development only): then every control route is open, as before this existed, and a warning says so.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from engine_agent.problems import ProblemError
from engine_agent.protocol import key_check

KEY_ENV = "EPCTL_AGENT_KEY"
PREVIOUS_KEY_ENV = "EPCTL_AGENT_KEY_PREVIOUS"
PREVIOUS_UNTIL_ENV = "EPCTL_AGENT_KEY_PREVIOUS_UNTIL"
DATA_KEY_ENV = "EPCTL_AGENT_DATA_KEY"
AUTH_HEADER = "Authorization"
BEARER = "Bearer "
MIN_KEY_CHARS = 16
WWW_AUTHENTICATE = {"WWW-Authenticate": 'Bearer realm="epctl-agent"'}
# Where the gate records what it checked (the route dependencies look for it).
SCOPE_PASSED = "epctl.agent.auth"


class Plane(StrEnum):
    control = "control"
    data = "data"


class Need(StrEnum):
    """What a route needs (`engine_agent.gate.need_of`)."""

    open = "open"  # liveness, metrics, the API docs
    data = "data"  # /v1/infer: the data key (or the control key) when a data key is set
    control = "control"  # every other route: the current key, or the previous one within its overlap
    current = "current"  # rotating the key: the current key only


# A refusal's problem code, by plane and whether a key was given at all.
REFUSAL_CODES = {
    (Plane.control, True): "agent-key-required",
    (Plane.control, False): "agent-key-invalid",
    (Plane.data, True): "data-key-required",
    (Plane.data, False): "data-key-invalid",
}


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def bearer_of(header: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, or None."""
    if header is None or not header.startswith(BEARER):
        return None
    return header[len(BEARER) :].strip() or None


def until_epoch(value: str | float | datetime) -> float:
    """`EPCTL_AGENT_KEY_PREVIOUS_UNTIL` as wall-clock epoch seconds: a number, or an ISO 8601 time
    with a zone (ValueError otherwise)."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, int | float):
        return float(value)
    else:
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"{PREVIOUS_UNTIL_ENV} needs a time zone (e.g. 2026-12-01T12:00:00Z)")
    return moment.timestamp()


class AgentKeys:
    """The digests of the keys this agent accepts. `rotate` (the coordinator's push, authenticated
    with the current key) makes a new key current and keeps the old one for `overlap_s`.

    `previous_until` (wall-clock epoch seconds) is turned into a deadline on the monotonic clock once,
    at start: a wall clock set back later cannot lengthen the overlap."""

    def __init__(
        self,
        key: str | None,
        *,
        previous: str | None = None,
        previous_until: float | None = None,
        data_key: str | None = None,
        insecure: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if previous is not None and previous_until is None:
            raise ValueError(f"a previous agent key needs its end ({PREVIOUS_UNTIL_ENV})")
        self.clock = clock
        self.insecure = insecure and key is None
        self._current = digest(key) if key else None
        self._check = key_check(key) if key else None
        # The one clear copy, only to call peers (`generation/broken`): checks use the digests.
        self._peer_key = key
        self._previous = digest(previous) if previous else None
        self._previous_until = (
            clock() + (previous_until - time.time()) if previous and previous_until is not None else None
        )
        self._data = digest(data_key) if data_key else None
        self._lock = threading.Lock()

    @property
    def data_key_required(self) -> bool:
        return self._data is not None

    def current_digest(self) -> bytes | None:
        with self._lock:
            return self._current

    def key_check(self) -> str | None:
        """The current key's public fingerprint (`protocol.key_check`), for the heartbeat."""
        with self._lock:
            return self._check

    def previous_for_s(self) -> float:
        """How much longer the previous key is accepted (0: no previous key, or its overlap ended)."""
        with self._lock:
            previous, until = self._previous, self._previous_until
        if previous is None or until is None:
            return 0.0
        return max(0.0, until - self.clock())

    def _matches_control(self, presented: bytes, *, current_only: bool) -> bool:
        with self._lock:
            current, previous, until = self._current, self._previous, self._previous_until
        ok = current is not None and hmac.compare_digest(presented, current)
        if not current_only and previous is not None and until is not None and self.clock() < until:
            ok = hmac.compare_digest(presented, previous) or ok
        return ok

    def accepts(self, need: Need | Plane, key: str | None, *, presented: bytes | None = None) -> bool:
        """Whether `key` opens a route that needs `need` (`presented`: its digest, when the caller has
        it already)."""
        need = Need(need.value)
        if need is Need.open:
            return True
        if need is not Need.data and self.insecure:
            return True
        if need is Need.data and self._data is None:
            return True  # the data key is off: /v1/infer is open
        if key is None:
            return False
        presented = presented or digest(key)
        if need is Need.data and self._data is not None and hmac.compare_digest(presented, self._data):
            return True
        # The control key also serves the data plane (the canary probe).
        return self._matches_control(presented, current_only=need is Need.current)

    def rotate(self, new_key: str, overlap_s: float) -> None:
        """`new_key` becomes current; the key current until now is accepted for `overlap_s` more (and
        the previous one before it no longer: there is one previous key at most)."""
        with self._lock:
            self._previous = self._current
            self._previous_until = self.clock() + overlap_s
            self._current = digest(new_key)
            self._check = key_check(new_key)
            self._peer_key = new_key
            self.insecure = False

    def peer_headers(self) -> dict[str, str]:
        """What a call to a peer agent carries: this deployment's key."""
        with self._lock:
            key = self._peer_key
        return {AUTH_HEADER: f"{BEARER}{key}"} if key else {}


_CONTROL_SCHEME = HTTPBearer(
    auto_error=False, scheme_name="agentKey", description="the deployment's agent key (control routes)"
)
_DATA_SCHEME = HTTPBearer(
    auto_error=False, scheme_name="dataKey", description="the data key, when the agent is given one"
)


def _passed(request: Request, plane: Plane) -> None:
    """The gate checked this call's key (it refuses before routing); a route reached without that
    (an app built without the gate) is refused, never served open."""
    if request.scope.get(SCOPE_PASSED) is None:
        raise ProblemError(
            401,
            REFUSAL_CODES[plane, False],
            f"this route needs the deployment's {plane.value} key as Authorization: Bearer <key>",
            headers=WWW_AUTHENTICATE,
        )


# Both dependencies are coroutines: a plain function would run in the thread pool, a thread hop on
# every call (pause, switch and arm included, inside the commit window).
async def require_control_key(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_CONTROL_SCHEME)]
) -> None:
    """A route dependency: the deployment's agent key (checked by the gate)."""
    _passed(request, Plane.control)


async def require_data_key(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_DATA_SCHEME)]
) -> None:
    """A route dependency for `/v1/infer`: the data key (or the control key) when one is set."""
    _passed(request, Plane.data)
