"""Typed dependencies for the routers: the database session and the caller's token, by permission."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core.auth import Permission, Principal, authorize
from app.core.config import Settings
from app.core.errors import AuthenticationError
from app.tokens.models import TokenRole
from app.tokens.service import authenticate

bearer_scheme = HTTPBearer(auto_error=False, description="an API token: `Authorization: Bearer epctl_...`")


def get_db_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.db_engine
    return engine


def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(engine: Annotated[Engine, Depends(get_db_engine)]) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_principal(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise AuthenticationError(
            "missing bearer token: send `Authorization: Bearer <token>`", code="missing-token"
        )
    token = authenticate(session, secret=credentials.credentials)
    if token is None:
        raise AuthenticationError("unknown or revoked token", code="invalid-token")
    return Principal(token_id=token.id, name=token.name, role=TokenRole(token.role))


def require(permission: Permission) -> Callable[[Principal], Principal]:
    def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
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
