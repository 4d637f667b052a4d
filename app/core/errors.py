"""Domain errors raised by the HTTP-free services. `app.core.problems` maps them to problem+json;
the CLI prints them. Each carries a stable machine-readable `code` and optional extra members."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    code = "error"
    title = "Error"

    def __init__(self, detail: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        self.extra = extra


class NotFoundError(DomainError):
    code = "not-found"
    title = "Not found"


class ConflictError(DomainError):
    """The request is well-formed but collides with the current state (an active job, a name taken)."""

    code = "conflict"
    title = "Conflict"


class InvalidRequestError(DomainError):
    """The request is well-formed JSON but asks for something that cannot be done."""

    code = "invalid-request"
    title = "Invalid request"


class AuthenticationError(DomainError):
    code = "unauthenticated"
    title = "Unauthorized"


class PermissionDeniedError(DomainError):
    code = "forbidden"
    title = "Forbidden"


class UnavailableError(DomainError):
    """A dependency (the database) is not ready."""

    code = "unavailable"
    title = "Service unavailable"


class TooManyRequestsError(DomainError):
    """The caller holds or sends more than its share (429, with `Retry-After`)."""

    code = "too-many-requests"
    title = "Too many requests"
    retry_after_s = 1


class UnsupportedMediaTypeError(DomainError):
    """The body's Content-Type is not one the operation takes (415)."""

    code = "unsupported-media-type"
    title = "Unsupported media type"
