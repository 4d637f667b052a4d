"""Idempotency-Key records for job creation: claim a key, answer a retry from it, prune old ones.

A key is scoped to the token that sent it. `claim_key` inserts it as in flight (the request may now
create its job) or answers from the existing record: the same body gets the first job back, another
body is refused, a retry while the first request is still in flight is a 409. A record whose request
died in flight long ago is taken over (`TakenOver`). HTTP-free; `app.jobs.service` uses it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import ConflictError, InvalidRequestError
from app.jobs.models import IdempotencyRecord, ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.states import JobNotFoundError


@dataclass(frozen=True)
class IdempotencyKey:
    """An Idempotency-Key as the services take it: the key, the scope it is unique in (the token that
    sent it), and how long a first request may stay in flight before a retry takes its key over."""

    key: str
    scope: str
    in_flight_timeout_s: float = 60.0


def request_hash(request: ReconfigurationCreate, requested_by: RequestSource) -> str:
    body = {**request.model_dump(mode="json"), "requested_by": requested_by.value}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def claim_key(
    session: Session, scope: str, key: str, request_hash: str, timeout_s: float
) -> tuple[IdempotencyRecord | None, ReconfigurationJob | None]:
    """Insert the key as in flight (ours to complete), or answer from the existing record. Concurrent
    requests with one key race here: each attempt either inserts, or reads the winner's record; a record
    deleted in between (its request was refused) is claimed again, a few times at most."""
    for _ in range(5):
        record = IdempotencyRecord(scope=scope, key=key, request_hash=request_hash, state="in_flight")
        session.add(record)
        try:
            session.commit()
            return record, None
        except IntegrityError:
            session.rollback()
        existing = session.exec(
            select(IdempotencyRecord)
            .where(IdempotencyRecord.scope == scope, IdempotencyRecord.key == key)
            .execution_options(populate_existing=True)
        ).first()
        if existing is None:  # deleted meanwhile (the first request was refused): try again
            continue
        return None, answer_from(session, existing, key, request_hash, timeout_s)
    raise in_flight(key)


def in_flight(key: str) -> ConflictError:
    return ConflictError(
        f"a request with Idempotency-Key {key!r} is still in flight; retry later",
        code="idempotency-key-in-flight",
    )


def answer_from(
    session: Session, existing: IdempotencyRecord, key: str, request_hash: str, timeout_s: float
) -> ReconfigurationJob:
    if existing.request_hash != request_hash:
        raise InvalidRequestError(
            f"Idempotency-Key {key!r} was already used with a different request body",
            code="idempotency-key-reused",
        )
    if existing.state == "completed" and existing.job_id is not None:
        return get_job(session, existing.job_id)
    if utc_now() - existing.updated_at < timedelta(seconds=timeout_s):
        raise in_flight(key)
    # The first request died in flight long ago: take the key over (compare-and-set on updated_at).
    taken = session.execute(
        sa.update(IdempotencyRecord)
        .where(
            col(IdempotencyRecord.id) == existing.id, col(IdempotencyRecord.updated_at) == existing.updated_at
        )
        .values(updated_at=utc_now())
    )
    session.commit()
    if taken.rowcount != 1:  # type: ignore[attr-defined]
        raise in_flight(key)
    raise TakenOver(existing)


def complete_key(session: Session, record_id: int, job_id: str, now: datetime) -> None:
    """Within the transaction that creates the job (the caller commits)."""
    session.execute(
        sa.update(IdempotencyRecord)
        .where(col(IdempotencyRecord.id) == record_id)
        .values(state="completed", job_id=job_id, response_status=202, updated_at=now)
    )


def forget_key(session: Session, record_id: int) -> None:
    """A refused request leaves no trace: the same key may be used again once the cause is fixed."""
    session.rollback()
    session.execute(sa.delete(IdempotencyRecord).where(col(IdempotencyRecord.id) == record_id))
    session.commit()


class TakenOver(Exception):
    """Internal: the stale in-flight record is ours now."""

    def __init__(self, record: IdempotencyRecord) -> None:
        self.record = record


def prune_idempotency_records(session: Session, *, older_than: datetime) -> int:
    """Delete Idempotency-Key records created before `older_than` (retention: the key may then be reused);
    returns how many."""
    result = session.execute(
        sa.delete(IdempotencyRecord).where(col(IdempotencyRecord.created_at) < older_than)
    )
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def get_job(session: Session, job_id: str) -> ReconfigurationJob:
    job = session.get(ReconfigurationJob, job_id, populate_existing=True)
    if job is None:
        raise JobNotFoundError(f"no reconfiguration {job_id!r}", job_id=job_id)
    return job
