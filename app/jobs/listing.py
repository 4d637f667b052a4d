"""Listing reconfiguration jobs: filters, newest first, pages by opaque cursor, and a count made once
on the first page (capped, exact or none) that the cursor carries to the next pages. HTTP-free.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import sqlalchemy as sa
from sqlmodel import Session, col, func, select

from app.core.errors import InvalidRequestError
from app.deployments.models import Deployment
from app.deployments.service import get_deployment
from app.jobs.models import JOB_ID_PREFIX, JobList, JobPublic, ReconfigurationJob, RequestSource
from app.jobs.states import JobState

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
COUNT_CAP = 1_000  # a capped count reads at most this many index entries


class CountMode(StrEnum):
    capped = "capped"  # exact up to COUNT_CAP matches, else COUNT_CAP marked inexact
    exact = "exact"
    none = "none"


def list_jobs(
    session: Session,
    *,
    deployment: str | None = None,
    state: JobState | None = None,
    source: RequestSource | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
    count_mode: CountMode = CountMode.capped,
) -> JobList:
    """Newest first. `cursor` is the `next_cursor` of the previous page.

    The count is made on the first page (no cursor) as `count_mode` asks; the cursor carries it on, so
    later pages repeat the first page's figure instead of counting every matching row again. A cursor
    without a count (or one made under other filters) counts afresh."""
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    filters: list[sa.ColumnElement[bool]] = []
    deployment_id: str | None = None
    if deployment is not None:
        deployment_id = get_deployment(session, ref=deployment).id
        filters.append(col(ReconfigurationJob.deployment_id) == deployment_id)
    if state is not None:
        filters.append(col(ReconfigurationJob.state) == state.value)
    if source is not None:
        filters.append(col(ReconfigurationJob.requested_by) == source.value)
    if created_after is not None:
        filters.append(col(ReconfigurationJob.created_at) >= created_after)
    if created_before is not None:
        filters.append(col(ReconfigurationJob.created_at) < created_before)
    filter_key = _filter_key(deployment_id, state, source, created_after, created_before)
    position = _decode_cursor(cursor, filter_key) if cursor is not None else None
    count, exact = (position.count, position.count_exact) if position is not None else (None, True)
    if count is None and count_mode is not CountMode.none:
        count, exact = _count(session, filters, count_mode)
    page = select(ReconfigurationJob).where(*filters)
    if position is not None:
        page = page.where(col(ReconfigurationJob.id) < position.after_id)
    rows = list(session.exec(page.order_by(col(ReconfigurationJob.id).desc()).limit(limit + 1)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    names = dict(session.exec(select(Deployment.id, Deployment.name)).all())
    return JobList(
        data=[JobPublic.of(r, deployment=names.get(r.deployment_id, "")) for r in rows],
        count=count,
        count_exact=exact,
        next_cursor=_encode_cursor(rows[-1].id, count, exact, filter_key) if more and rows else None,
    )


def _count(session: Session, filters: list[sa.ColumnElement[bool]], mode: CountMode) -> tuple[int, bool]:
    """(count, exact). A capped count stops after COUNT_CAP + 1 matches: on Postgres an exact count of
    a large history reads every matching row and dominated the list's time."""
    if mode is CountMode.exact:
        return session.exec(select(func.count()).select_from(ReconfigurationJob).where(*filters)).one(), True
    matches = sa.select(sa.literal(1)).select_from(ReconfigurationJob).where(*filters).limit(COUNT_CAP + 1)
    found = int(session.execute(sa.select(func.count()).select_from(matches.subquery())).scalar_one())
    return (found, True) if found <= COUNT_CAP else (COUNT_CAP, False)


@dataclass(frozen=True)
class _CursorPosition:
    after_id: str  # the last job id of the previous page
    count: int | None  # the first page's count, when the cursor carries one for these filters
    count_exact: bool = True


def _filter_key(*filters: object) -> str:
    """A short digest of the filters, so a count is carried only to pages of the same query."""
    text = "|".join(
        "" if f is None else (f.isoformat() if isinstance(f, datetime) else str(f)) for f in filters
    )
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _encode_cursor(job_id: str, count: int | None, exact: bool, filter_key: str) -> str:
    # "<job id>~<count>[+]~<filter key>" ("+": a lower bound); job ids are Crockford base32, never "~".
    shown = "" if count is None else f"{count}{'' if exact else '+'}"
    payload = f"{job_id}~{shown}~{filter_key}"
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, filter_key: str) -> _CursorPosition:
    """Accepts this version's cursors and the bare job id of earlier ones (which carry no count)."""
    try:
        payload = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, ValueError):  # ValueError: not ASCII, or not UTF-8 once decoded
        payload = ""
    job_id, *extra = payload.split("~")
    count: int | None = None
    exact = True
    if len(extra) == 2 and extra[1] == filter_key:
        digits = extra[0].removesuffix("+")
        if digits.isascii() and digits.isdigit() and len(digits) <= 18:
            count, exact = int(digits), not extra[0].endswith("+")
    if (
        not job_id.startswith(JOB_ID_PREFIX + "_")
        or not job_id.isascii()
        or len(job_id) > 64
        or len(extra) not in (0, 2)
    ):
        raise InvalidRequestError(
            "malformed cursor: pass a next_cursor value unchanged", code="invalid-cursor"
        )
    return _CursorPosition(after_id=job_id, count=count, count_exact=exact)
