"""RFC 9457 problem details for every error the API returns, routing and validation errors included.

The body, the media type, the OpenAPI entries and the routing/validation handlers are shared with the
agents (`engine_agent.problems`, torch-free, which also states the error-code style: kebab-case). This
module adds what only the coordinator has: its domain errors, database refusals and the catch-all."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import exc as sa_exc

from app.core.errors import (
    AuthenticationError,
    ConflictError,
    DomainError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    TooManyRequestsError,
    UnavailableError,
    UnsupportedMediaTypeError,
)
from engine_agent import problems as shared
from engine_agent.problems import (
    PROBLEM_MEDIA_TYPE,
    TYPE_PREFIX,
    Problem,
    problem_response,
    problem_responses,
)

__all__ = [
    "PROBLEM_MEDIA_TYPE",
    "TYPE_PREFIX",
    "Problem",
    "install_problem_handlers",
    "problem_response",
    "problem_responses",
    "status_of",
]

log = logging.getLogger(__name__)

_STATUS_OF: list[tuple[type[DomainError], int]] = [
    (NotFoundError, 404),
    (ConflictError, 409),
    (InvalidRequestError, 422),
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    (UnavailableError, 503),
    (TooManyRequestsError, 429),
    (UnsupportedMediaTypeError, 415),
]


def status_of(error: DomainError) -> int:
    for error_type, status in _STATUS_OF:
        if isinstance(error, error_type):
            return status
    return 400


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DomainError)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthenticationError) else None
    if isinstance(exc, TooManyRequestsError | UnavailableError):
        headers = {"Retry-After": str(getattr(exc, "retry_after_s", 1))}
    return problem_response(
        request,
        status=status_of(exc),
        code=exc.code,
        detail=exc.detail,
        title=exc.title,
        headers=headers,
        **exc.extra,
    )


async def _unstorable_input(request: Request, exc: Exception) -> JSONResponse:
    # The database refused a value the request carried (a NUL character on Postgres, a number out of
    # range): the client's input, so a 4xx; the failed statement rolled its transaction back.
    log.info("database refused request data on %s %s: %s", request.method, request.url.path, exc)
    return problem_response(
        request,
        status=422,
        code="unstorable-value",
        title="Request validation failed",
        detail="the request carries a value the database cannot store (for example a NUL character)",
    )


async def _integer_overflow(request: Request, exc: Exception) -> Response:
    # SQLite's driver refuses integers beyond 64 bits with a bare OverflowError (not a DBAPI error).
    # The API's models bound every stored integer, so this is a last line: a 422, never a 500.
    if "SQLite INTEGER" not in str(exc):
        return await _unexpected_error(request, exc)
    return await _unstorable_input(request, exc)


async def _database_busy(request: Request, exc: Exception) -> Response:
    # The pool had no free connection in time, or SQLite's write lock stayed taken past its busy
    # timeout: the coordinator is overloaded, not broken. 503 with Retry-After, and nothing changed.
    busy = isinstance(exc, sa_exc.TimeoutError) or "database is locked" in str(exc)
    if not busy:
        return await _unexpected_error(request, exc)
    log.warning("database busy on %s %s: %s", request.method, request.url.path, exc)
    return problem_response(
        request,
        status=503,
        code="database-busy",
        detail="the database is busy; retry shortly",
        headers={"Retry-After": "1"},
    )


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(
        request,
        status=500,
        code="internal-error",
        detail="an unexpected error occurred; see the coordinator's log",
    )


def install_problem_handlers(app: FastAPI) -> None:
    shared.install_problem_handlers(app)
    app.add_exception_handler(DomainError, _domain_error)
    app.add_exception_handler(sa_exc.DataError, _unstorable_input)
    app.add_exception_handler(OverflowError, _integer_overflow)
    app.add_exception_handler(sa_exc.TimeoutError, _database_busy)
    app.add_exception_handler(sa_exc.OperationalError, _database_busy)
    app.add_exception_handler(Exception, _unexpected_error)
