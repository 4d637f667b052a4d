"""Who may call the agent: the deployment's agent key for every control route, an optional data key
for `/v1/infer`. Both travel as `Authorization: Bearer <key>`.

The agent keeps only the keys' SHA-256 digests and compares digests with `hmac.compare_digest`
(constant time). During a rotation the previous key is accepted until its overlap ends. `/healthz`
and `/metrics` stay open; every other route needs a key. A refused call is a 401 problem+json that
changes nothing, counted in `epctl_agent_auth_failures` and logged with the caller's address.

An agent started without a key refuses to start, unless started with `--insecure-no-agent-key`
(development only): then every control route is open, as before this existed, and a warning says so.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from enum import StrEnum
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Counter

from engine_agent.problems import ProblemError

log = logging.getLogger(__name__)

KEY_ENV = "EPCTL_AGENT_KEY"
PREVIOUS_KEY_ENV = "EPCTL_AGENT_KEY_PREVIOUS"
DATA_KEY_ENV = "EPCTL_AGENT_DATA_KEY"
AUTH_HEADER = "Authorization"
BEARER = "Bearer "
MIN_KEY_CHARS = 16
WWW_AUTHENTICATE = {"WWW-Authenticate": 'Bearer realm="epctl-agent"'}


class Plane(StrEnum):
    control = "control"
    data = "data"


# A refusal's problem code, by plane and whether a key was given at all.
REFUSAL_CODES = {
    (Plane.control, True): "agent-key-required",
    (Plane.control, False): "agent-key-invalid",
    (Plane.data, True): "data-key-required",
    (Plane.data, False): "data-key-invalid",
}


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def presented_key(request: Request) -> str | None:
    header = request.headers.get(AUTH_HEADER)
    if header is None or not header.startswith(BEARER):
        return None
    return header[len(BEARER) :].strip() or None


class AgentKeys:
    """The digests of the keys this agent accepts. `rotate` (the coordinator's push, authenticated
    with the current key) makes a new key current and keeps the old one for `overlap_s`."""

    def __init__(
        self,
        key: str | None,
        *,
        previous: str | None = None,
        previous_overlap_s: float | None = None,
        data_key: str | None = None,
        insecure: bool = False,
    ) -> None:
        self.insecure = insecure and key is None
        self._current = digest(key) if key else None
        # The one clear copy, only to call peers (`generation/broken`): checks use the digests.
        self._peer_key = key
        self._previous = digest(previous) if previous else None
        # None: the previous key (given at start by the environment) is accepted until a rotation.
        self._previous_until = None if previous_overlap_s is None else time.monotonic() + previous_overlap_s
        self._data = digest(data_key) if data_key else None
        self._lock = threading.Lock()
        self.failures: Counter | None = None

    def register(self, registry: CollectorRegistry) -> None:
        """Count refused calls on the agent's registry (only labels: no key material)."""
        self.failures = Counter(
            "epctl_agent_auth_failures",
            "Calls refused for a missing or wrong key, by plane (control, data) and reason",
            ["plane", "reason"],
            registry=registry,
        )

    @property
    def data_key_required(self) -> bool:
        return self._data is not None

    def _matches_control(self, presented: bytes) -> bool:
        with self._lock:
            current, previous, until = self._current, self._previous, self._previous_until
        ok = current is not None and hmac.compare_digest(presented, current)
        if previous is not None and (until is None or time.monotonic() < until):
            ok = hmac.compare_digest(presented, previous) or ok
        return ok

    def accepts(self, plane: Plane, key: str | None) -> bool:
        if plane == Plane.control and self.insecure:
            return True
        if plane == Plane.data and self._data is None:
            return True  # the data key is off: /v1/infer is open
        if key is None:
            return False
        presented = digest(key)
        if plane == Plane.data and self._data is not None and hmac.compare_digest(presented, self._data):
            return True
        return self._matches_control(presented)  # the control key also serves (the canary probe)

    def rotate(self, new_key: str, overlap_s: float) -> None:
        """`new_key` becomes current; the key current until now is accepted for `overlap_s` more."""
        with self._lock:
            self._previous = self._current
            self._previous_until = time.monotonic() + overlap_s
            self._current = digest(new_key)
            self._peer_key = new_key
            self.insecure = False

    def peer_headers(self) -> dict[str, str]:
        """What a call to a peer agent carries: this deployment's key."""
        with self._lock:
            key = self._peer_key
        return {AUTH_HEADER: f"{BEARER}{key}"} if key else {}

    def check(self, request: Request, plane: Plane) -> None:
        key = presented_key(request)
        if self.accepts(plane, key):
            return
        reason = "missing" if key is None else "wrong"
        if self.failures is not None:
            self.failures.labels(plane=plane.value, reason=reason).inc()
        caller = request.client.host if request.client else "unknown"
        log.warning(
            "refused %s %s from %s: %s %s key", request.method, request.url.path, caller, reason, plane.value
        )
        raise ProblemError(
            401,
            REFUSAL_CODES[plane, key is None],
            f"this route needs the deployment's {plane.value} key as Authorization: Bearer <key>",
            headers=WWW_AUTHENTICATE,
        )


_CONTROL_SCHEME = HTTPBearer(
    auto_error=False, scheme_name="agentKey", description="the deployment's agent key (control routes)"
)
_DATA_SCHEME = HTTPBearer(
    auto_error=False, scheme_name="dataKey", description="the data key, when the agent is given one"
)


def _keys(request: Request) -> AgentKeys:
    keys = getattr(request.app.state, "keys", None)
    if not isinstance(keys, AgentKeys):
        raise ProblemError(503, "starting", "the agent is still starting")
    return keys


# Both dependencies are coroutines: a plain function would run in the thread pool, a thread hop on
# every call (pause, switch and arm included, inside the commit window); the check takes microseconds.
async def require_control_key(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_CONTROL_SCHEME)]
) -> None:
    """A route dependency: the deployment's agent key (current, or previous within its overlap)."""
    _keys(request).check(request, Plane.control)


async def require_data_key(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_DATA_SCHEME)]
) -> None:
    """A route dependency for `/v1/infer`: the data key (or the control key) when one is set."""
    _keys(request).check(request, Plane.data)
