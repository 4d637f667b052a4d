"""Typed dependencies for the routers: the database, the settings and the caller's token, by permission.

Every dependency here is `async`: a sync dependency would take a worker thread of its own, and the
database is reached only through `Database.run` (see `app.api.database`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine

from app.api.database import Database
from app.core.auth import Permission, Principal, TokenRole, authorize
from app.core.config import Settings
from app.core.errors import AuthenticationError, TooManyRequestsError
from app.tokens.service import authenticate, hash_token
from engine_agent.throttle import FailureThrottle, RefusalLog, retry_after_header

log = logging.getLogger("app.auth")

bearer_scheme = HTTPBearer(auto_error=False, description="an API token: `Authorization: Bearer epctl_...`")


async def get_db_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.db_engine
    return engine


async def get_database(request: Request) -> Database:
    database: Database = request.app.state.database
    return database


async def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


DatabaseDep = Annotated[Database, Depends(get_database)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


class PrincipalCache:
    """Valid tokens seen in the last `ttl_s` seconds, by the hash of their secret: under load, one
    database lookup per token per interval instead of one per request. Only successes are kept (an
    unknown secret always reaches the database), the cache is bounded, and a revoke through this
    coordinator clears it at once; another coordinator's revoke is seen within `ttl_s`."""

    MAX_ENTRIES = 10_000

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, Principal]] = {}

    def get(self, secret_hash: str) -> Principal | None:
        entry = self._entries.get(secret_hash)
        if entry is None or time.monotonic() - entry[0] > self.ttl_s:
            return None
        return entry[1]

    def seen(self, secret_hash: str, within_s: float) -> Principal | None:
        """The principal of a token found valid within the last `within_s` seconds, whatever the cache's
        own time to live (a revoke through this coordinator clears it): for heartbeats shed under load
        (`app.core.shedding`), which must not depend on another request refreshing the cache."""
        entry = self._entries.get(secret_hash)
        if entry is None or time.monotonic() - entry[0] > within_s:
            return None
        return entry[1]

    def put(self, secret_hash: str, principal: Principal) -> None:
        if self.ttl_s <= 0:
            return
        if len(self._entries) >= self.MAX_ENTRIES:
            self._entries.clear()
        self._entries[secret_hash] = (time.monotonic(), principal)

    def clear(self) -> None:
        self._entries.clear()


async def get_principal_cache(request: Request) -> PrincipalCache:
    cache: PrincipalCache | None = getattr(request.app.state, "principal_cache", None)
    if cache is None:
        settings: Settings | None = getattr(request.app.state, "settings", None)
        cache = PrincipalCache(settings.auth_cache_s if settings is not None else 0.0)
        request.app.state.principal_cache = cache
    return cache


PrincipalCacheDep = Annotated[PrincipalCache, Depends(get_principal_cache)]


@dataclass
class AuthGuard:
    """Failed authentication per client address (`engine_agent.throttle`, as on the agents): after
    `auth_failure_burst` failures a client is answered 429 before its token is looked up (no database
    read), unless that token already worked from the same address; refusals are summed up in the log."""

    throttle: FailureThrottle = field(default_factory=FailureThrottle)
    refusals: RefusalLog = field(default_factory=lambda: RefusalLog(log))

    @classmethod
    def from_settings(cls, settings: Settings) -> AuthGuard:
        throttle = FailureThrottle(burst=settings.auth_failure_burst, refill_s=settings.auth_failure_refill_s)
        return cls(throttle=throttle)


async def get_auth_guard(request: Request) -> AuthGuard:
    guard: AuthGuard | None = getattr(request.app.state, "auth_guard", None)
    if guard is None:
        settings: Settings | None = getattr(request.app.state, "settings", None)
        guard = AuthGuard.from_settings(settings) if settings is not None else AuthGuard()
        request.app.state.auth_guard = guard
    return guard


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Principal:
    # The database, the cache and the guard are the app's own, read here rather than as dependencies of
    # their own: each dependency costs every request its solving (issue 37: 700 heartbeats a second).
    database, cache = await get_database(request), await get_principal_cache(request)
    guard = await get_auth_guard(request)
    client = _client(request)
    given = (
        credentials is not None and credentials.scheme.lower() == "bearer" and bool(credentials.credentials)
    )
    secret = credentials.credentials if credentials is not None and given else None
    secret_hash = hash_token(secret) if secret is not None else None
    wait = guard.throttle.retry_after(client, secret_hash.encode() if secret_hash is not None else None)
    if wait is not None:
        guard.refusals.refused(client, "throttled", f"{request.method} {request.url.path}")
        refused = TooManyRequestsError(
            "too many calls with a missing or unknown token from this address; retry later",
            code="too-many-failed-attempts",
        )
        refused.retry_after_s = int(retry_after_header(wait))
        raise refused
    if secret is None or secret_hash is None:
        guard.throttle.failed(client)
        guard.refusals.refused(client, "missing token", f"{request.method} {request.url.path}")
        raise AuthenticationError(
            "missing bearer token: send `Authorization: Bearer <token>` (epctl: `--token` or "
            "`EPCTL_TOKEN`; `epctl up` keeps its admin token in `<data dir>/admin-token`)",
            code="missing-token",
        )
    cached = cache.get(secret_hash)
    if cached is not None:
        guard.throttle.succeeded(client, secret_hash.encode())
        return cached
    token = await database.run(lambda session: authenticate(session, secret=secret))
    if token is None:
        guard.throttle.failed(client)
        guard.refusals.refused(client, "unknown or revoked token", f"{request.method} {request.url.path}")
        raise AuthenticationError("unknown or revoked token", code="invalid-token")
    guard.throttle.succeeded(client, secret_hash.encode())
    principal = Principal(token_id=token.id, name=token.name, role=TokenRole(token.role))
    cache.put(secret_hash, principal)
    return principal


def require(permission: Permission) -> Callable[[Principal], Coroutine[Any, Any, Principal]]:
    async def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        return authorize(principal, permission)

    dependency.__name__ = f"require_{permission.value}"
    return dependency


Reader = Annotated[Principal, Depends(require(Permission.read))]
Scaler = Annotated[Principal, Depends(require(Permission.scale))]
Canceller = Annotated[Principal, Depends(require(Permission.cancel))]
EngineAgent = Annotated[Principal, Depends(require(Permission.engines))]
CleanupOperator = Annotated[Principal, Depends(require(Permission.cleanup))]
Admin = Annotated[Principal, Depends(require(Permission.configure))]
TokenAdmin = Annotated[Principal, Depends(require(Permission.tokens))]
WebhookAdmin = Annotated[Principal, Depends(require(Permission.webhooks))]
