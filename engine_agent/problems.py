"""problem+json (RFC 9457) for both HTTP APIs, the coordinator's and the agents': the body, the media
type, the OpenAPI entries and the handlers every app installs (routing, validation and raised
problems). Torch-free: the coordinator imports it, as it imports `protocol.py`; `app.core.problems` adds
its domain errors on top.

Error-code style, one for the whole system: every machine-readable code is lower-case kebab-case ASCII
(`active-job-exists`, `policy-mismatch`, `wrong-phase`). That holds for a problem's `code` (also the
last part of its `type`, `urn:epctl:problem:<code>`), a job's `error.type` and an agent's
`AgentError.type`. A code names the condition, not the HTTP status; once published it is stable
(clients branch on it), while `detail` is for people and may change. `is_code` checks the style.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:epctl:problem:"

_CODE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def is_code(code: str) -> bool:
    """Whether `code` follows the error-code style (kebab-case)."""
    return _CODE.fullmatch(code) is not None


class Problem(BaseModel):
    """application/problem+json (RFC 9457). `code` repeats the type's last part; extra members vary."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["urn:epctl:problem:active-job-exists"])
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    code: str


class ProblemError(Exception):
    """Raised in a route: answered as problem+json with `type` urn:epctl:problem:<code>; `extra`
    becomes extra members of the body."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.title, self.headers, self.extra = title, headers, extra


VALIDATION_TITLE = "Request validation failed"  # every 422 about the request's own content


def default_title(status: int) -> str:
    """The status phrase in sentence case ("Not found"), as the domain errors' titles are written."""
    phrase = HTTPStatus(status).phrase
    return phrase[:1] + phrase[1:].lower()


def problem_document(
    *, status: int, code: str, detail: str | None, instance: str, title: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The one shape of every problem body, whoever answers (a handler, or a middleware ahead of the
    app such as the coordinator's input limits)."""
    return {
        "type": TYPE_PREFIX + code,
        "title": title or default_title(status),
        "status": status,
        "detail": detail,
        "instance": instance,
        "code": code,
        **jsonable_encoder(extra),
    }


def render_problem(document: dict[str, Any]) -> bytes:
    """A problem body as bytes, in the JSON style of every other answer (Starlette's JSONResponse)."""
    return bytes(JSONResponse(document).body)


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
    body = problem_document(
        status=status, code=code, detail=detail, instance=request.url.path, title=title, **extra
    )
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


_CODE_OF_STATUS = {404: "not-found", 405: "method-not-allowed", 401: "unauthenticated", 403: "forbidden"}


def code_of_status(status: int) -> str:
    """The code of a bare HTTP error (a route not found, a method not allowed): its phrase, kebab-cased."""
    return _CODE_OF_STATUS.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "-")


async def _raised_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)
    return problem_response(
        request,
        status=exc.status,
        code=exc.code,
        detail=exc.detail,
        title=exc.title,
        headers=exc.headers,
        **exc.extra,
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if status == 404 and detail == "Not Found":
        detail = f"no route {request.method} {request.url.path}"
    headers = dict(exc.headers) if exc.headers else {}
    if status == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
        headers["Allow"] = ", ".join(_allowed_methods(request)) or headers.get("Allow", "")
    return problem_response(
        request, status=status, code=code_of_status(status), detail=detail, headers=headers or None
    )


def _allowed_methods(request: Request) -> list[str]:
    """Every documented method at this path (Starlette names only the first matching route's)."""
    app = request.app
    table: list[tuple[re.Pattern[str], list[str]]] | None = getattr(app.state, "allow_table", None)
    if table is None:
        table = [
            (
                re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", path) + "$"),
                sorted(m.upper() for m in operations),
            )
            for path, operations in app.openapi().get("paths", {}).items()
        ]
        app.state.allow_table = table
    return next((methods for pattern, methods in table if pattern.match(request.url.path)), [])


def _undeclared_json(request: Request) -> str | None:
    """A body sent without saying it is JSON: its media type ("none" when absent), else None."""
    sized = request.headers.get("content-length", "0").strip() not in ("", "0")
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not (sized or chunked) or media == "application/json" or media.endswith("+json"):
        return None
    if not media and getattr(request.scope.get("route"), "strict_content_type", True) is False:
        return None  # a route that reads a body without Content-Type as JSON (Kubernetes' /scale) did
    return media or "none"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    media = _undeclared_json(request)
    if media is not None and any(tuple(err.get("loc", ())) == ("body",) for err in exc.errors()):
        # The body was never read as JSON, so "Input should be a valid dictionary" would mislead.
        return problem_response(
            request,
            status=415,
            code="unsupported-media-type",
            title="Unsupported media type",
            detail=f"the body must be JSON, sent with Content-Type: application/json (this one: {media})",
        )
    errors = [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors()
    ]
    summary = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:5])
    # A misspelt field is refused, never ignored: name the unknown fields on their own.
    unknown = [".".join(str(p) for p in e["loc"][1:]) for e in errors if e["type"] == "extra_forbidden"]
    extra: dict[str, Any] = {"unknown_fields": unknown} if unknown else {}
    if unknown and len(unknown) == len(errors):
        summary = "unknown field" + ("s " if len(unknown) > 1 else " ") + ", ".join(repr(u) for u in unknown)
    return problem_response(
        request,
        status=422,
        code="validation-error",
        title=VALIDATION_TITLE,
        detail=summary or "the request is malformed",
        errors=errors,
        **extra,
    )


def install_problem_handlers(app: FastAPI) -> None:
    """Answer raised `ProblemError`s, unknown routes and methods, and request validation errors as
    problem+json, and document error responses as problem+json only."""
    app.add_exception_handler(ProblemError, _raised_problem)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    _document_problems_only_as_problem_json(app)


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


def _document_problems_only_as_problem_json(app: FastAPI) -> None:
    """Error responses are documented as application/problem+json only (FastAPI adds application/json)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for path in schema["paths"].values():
                for operation in path.values():
                    for response in operation.get("responses", {}).values():
                        content = response.get("content", {})
                        if PROBLEM_MEDIA_TYPE in content:
                            content.pop("application/json", None)
        return app.openapi_schema or generate()

    app.openapi = openapi  # type: ignore[method-assign]
