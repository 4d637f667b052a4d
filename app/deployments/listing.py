"""Listing deployments: by name, in pages of `limit` with an opaque cursor (like the job list), and the
total count. HTTP-free."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from sqlmodel import Session, col, func, select

from app.core.errors import InvalidRequestError
from app.deployments.models import Deployment

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
# A cursor is the last name of the previous page (a name is at most 63 printable characters).
_NAME = re.compile(r"^[!-~]{1,63}$")


@dataclass(frozen=True)
class DeploymentPage:
    rows: list[Deployment]
    count: int  # every deployment, over all pages
    next_cursor: str | None


def list_page(
    session: Session, *, limit: int = DEFAULT_PAGE_SIZE, cursor: str | None = None
) -> DeploymentPage:
    """Deployments by name, after `cursor` (the `next_cursor` of the previous page). Two queries."""
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    page = select(Deployment)
    if cursor is not None:
        page = page.where(col(Deployment.name) > _decode_cursor(cursor))
    rows = list(session.exec(page.order_by(col(Deployment.name)).limit(limit + 1)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    count = session.exec(select(func.count()).select_from(Deployment)).one()
    next_cursor = _encode_cursor(rows[-1].name) if more and rows else None
    return DeploymentPage(rows=rows, count=count, next_cursor=next_cursor)


def _encode_cursor(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> str:
    try:
        name = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, ValueError):
        name = ""
    if not _NAME.match(name):
        raise InvalidRequestError(
            "malformed cursor: pass a next_cursor value unchanged", code="invalid-cursor"
        )
    return name
