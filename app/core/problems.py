"""RFC 9457 problem details for every error the API returns, routing and validation errors included."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.errors import (
    AuthenticationError,
    ConflictError,
    DomainError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
)

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:epctl:problem:"
log = logging.getLogger(__name__)

_STATUS_OF: list[tuple[type[DomainError], int]] = [
    (NotFoundError, 404),
    (ConflictError, 409),
    (InvalidRequestError, 422),
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    (UnavailableError, 503),
]


class Problem(BaseModel):
    """application/problem+json (RFC 9457). `code` repeats the type's last part; extra members vary."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["urn:epctl:problem:active-job-exists"])
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    code: str


def problem_response(
    request: Request,
    *,
    status: int,
    code: str,
    detail: str | None,
    title: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {
        "type": TYPE_PREFIX + code,
        "title": title or HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "instance": request.url.path,
        "code": code,
        **jsonable_encoder(extra),
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def status_of(error: DomainError) -> int:
    for error_type, status in _STATUS_OF:
        if isinstance(error, error_type):
            return status
    return 400


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DomainError)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthenticationError) else None
    return problem_response(
        request,
        status=status_of(exc),
        code=exc.code,
        detail=exc.detail,
        title=exc.title,
        headers=headers,
        **exc.extra,
    )


_CODE_OF_STATUS = {404: "not-found", 405: "method-not-allowed", 401: "unauthenticated", 403: "forbidden"}


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    code = _CODE_OF_STATUS.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "-")
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if status == 404 and detail == "Not Found":
        detail = f"no route {request.method} {request.url.path}"
    if status == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    return problem_response(
        request, status=status, code=code, detail=detail, headers=dict(exc.headers) if exc.headers else None
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]
    summary = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:5])
    return problem_response(
        request,
        status=422,
        code="validation-error",
        title="Request validation failed",
        detail=summary or "the request is malformed",
        errors=errors,
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


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(
        request,
        status=500,
        code="internal-error",
        detail="an unexpected error occurred; see the coordinator's log",
    )


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(DomainError, _domain_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(sa_exc.DataError, _unstorable_input)
    app.add_exception_handler(Exception, _unexpected_error)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries declaring problem+json for these statuses."""
    return {
        status: {
            "model": Problem,
            "description": HTTPStatus(status).phrase,
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }
