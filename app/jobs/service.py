"""Reconfiguration jobs: create (validated, idempotent), read, list, cancel. HTTP-free.

State changes after creation go through `app.jobs.states.transition` / `append_event` only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NoReturn

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from app.core.clock import utc_now
from app.core.errors import ConflictError, InvalidRequestError
from app.core.ids import new_id
from app.deployments.models import Deployment, LauncherKind
from app.deployments.service import active_job_id, get_deployment
from app.engines.service import available_engines
from app.jobs.cleanup import check_no_unresolved_cleanup
from app.jobs.models import (
    JOB_ID_PREFIX,
    IdempotencyRecord,
    JobDetail,
    JobEvent,
    JobEventPublic,
    JobList,
    JobPublic,
    ReconfigurationCreate,
    ReconfigurationJob,
    RequestSource,
)
from app.jobs.states import (
    CANCELLABLE_STATES,
    TERMINAL_STATES,
    JobNotFoundError,
    JobState,
    StaleTransitionError,
    append_event,
    transition,
)

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200


class ActiveJobConflictError(ConflictError):
    code = "active-job-exists"


@dataclass(frozen=True)
class CreateOutcome:
    job: ReconfigurationJob
    replayed: bool  # an Idempotency-Key retry answered with the job the first request created


@dataclass(frozen=True)
class CancelOutcome:
    job: ReconfigurationJob
    immediate: bool  # cancelled now (it was pending) rather than asked of the runner


# --- create ------------------------------------------------------------------------------------------


def create_reconfiguration(
    session: Session,
    *,
    request: ReconfigurationCreate,
    requested_by: RequestSource,
    requester: str | None = None,
    idempotency_key: str | None = None,
    idempotency_scope: str | None = None,
    idempotency_timeout_s: float = 60.0,
) -> CreateOutcome:
    """Validate and insert a pending job (with its first log row). With an Idempotency-Key: the same key
    and body return the first job (`replayed`), another body raises 422, a retry while the first
    request is in flight raises 409. Any refusal writes nothing."""
    if idempotency_key is None:
        return CreateOutcome(_create(session, request, requested_by, requester, None, None), False)
    scope = idempotency_scope or requester or ""
    request_hash = _request_hash(request, requested_by)
    record, replay = _claim_key(session, scope, idempotency_key, request_hash, idempotency_timeout_s)
    if replay is not None:
        return CreateOutcome(replay, True)
    assert record is not None and record.id is not None
    try:
        job = _create(session, request, requested_by, requester, idempotency_key, record.id)
    except BaseException:
        # A refused request leaves no trace: the same key may be used again once the cause is fixed.
        session.rollback()
        session.execute(sa.delete(IdempotencyRecord).where(col(IdempotencyRecord.id) == record.id))
        session.commit()
        raise
    return CreateOutcome(job, False)


def _create(
    session: Session,
    request: ReconfigurationCreate,
    requested_by: RequestSource,
    requester: str | None,
    idempotency_key: str | None,
    idempotency_record_id: int | None,
) -> ReconfigurationJob:
    deployment = get_deployment(session, ref=request.deployment)
    _validate_target(session, deployment, request.target_dp_size)
    check_no_unresolved_cleanup(session, deployment.id, deployment.name)
    warmup_requested = request.warmup_policy.value if request.warmup_policy else deployment.warmup_policy
    now = utc_now()
    job = ReconfigurationJob(
        id=new_id(JOB_ID_PREFIX),
        deployment_id=deployment.id,
        state=JobState.pending.value,
        from_dp_size=deployment.current_dp_size,
        to_dp_size=request.target_dp_size,
        from_generation=deployment.generation,
        to_generation=deployment.generation + 1,
        requested_by=requested_by.value,
        requester=requester,
        reason=request.reason,
        # `auto` is resolved by the runner once it knows the participants' platforms.
        warmup_policy=None if warmup_requested == "auto" else warmup_requested,
        warmup_policy_requested=warmup_requested,
        strategy=request.strategy.value if request.strategy else deployment.strategy,
        idempotency_key=idempotency_key,
        last_event_seq=1,
        created_at=now,
        updated_at=now,
    )
    session.add(job)
    try:
        session.flush()  # the job row first: the event row references it
    except IntegrityError:
        _raise_active_job_conflict(session, deployment)
    session.add(
        JobEvent(
            job_id=job.id,
            seq=1,
            kind="created",
            to_state=JobState.pending.value,
            created_at=now,
            message=f"scale {deployment.name} {job.from_dp_size} -> {job.to_dp_size} "
            f"requested by {requested_by.value}" + (f" ({requester})" if requester else ""),
        )
    )
    if idempotency_record_id is not None:
        session.execute(
            sa.update(IdempotencyRecord)
            .where(col(IdempotencyRecord.id) == idempotency_record_id)
            .values(state="completed", job_id=job.id, response_status=202, updated_at=now)
        )
    try:
        session.commit()
    except IntegrityError:
        _raise_active_job_conflict(session, deployment)
    return job


def _raise_active_job_conflict(session: Session, deployment: Deployment) -> NoReturn:
    """The database's one-active-job index refused our insert: another request or coordinator won."""
    session.rollback()
    active = active_job_id(session, deployment_id=deployment.id)
    if active is None:
        raise
    raise ActiveJobConflictError(
        f"deployment {deployment.name!r} already has an active reconfiguration {active}",
        active_job_id=active,
        deployment=deployment.name,
    ) from None


def _validate_target(session: Session, deployment: Deployment, target: int) -> None:
    if not deployment.min_dp_size <= target <= deployment.max_dp_size:
        raise InvalidRequestError(
            f"target_dp_size {target} is outside deployment {deployment.name!r}'s limits "
            f"[{deployment.min_dp_size}, {deployment.max_dp_size}]",
            code="target-out-of-range",
            min_dp_size=deployment.min_dp_size,
            max_dp_size=deployment.max_dp_size,
        )
    if target == deployment.current_dp_size:
        raise ConflictError(
            f"deployment {deployment.name!r} already runs at DP size {target}",
            code="already-at-target",
            current_dp_size=deployment.current_dp_size,
        )
    if deployment.launcher == LauncherKind.static:
        known = len(available_engines(session, deployment_id=deployment.id))
        if target > known:
            raise ConflictError(
                f"deployment {deployment.name!r} uses static launch and knows {known} engine(s); "
                f"target_dp_size {target} needs {target}: register more engines first",
                code="not-enough-engines",
                known_engines=known,
            )


def _request_hash(request: ReconfigurationCreate, requested_by: RequestSource) -> str:
    body = {**request.model_dump(mode="json"), "requested_by": requested_by.value}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _claim_key(
    session: Session, scope: str, key: str, request_hash: str, timeout_s: float
) -> tuple[IdempotencyRecord | None, ReconfigurationJob | None]:
    """Insert the key as in flight (ours to complete), or answer from the existing record."""
    record = IdempotencyRecord(scope=scope, key=key, request_hash=request_hash, state="in_flight")
    session.add(record)
    try:
        session.commit()
        return record, None
    except IntegrityError:
        session.rollback()
    existing = session.exec(
        select(IdempotencyRecord).where(IdempotencyRecord.scope == scope, IdempotencyRecord.key == key)
    ).first()
    if existing is None:  # deleted meanwhile (the first request was refused): try once more
        return _claim_key(session, scope, key, request_hash, timeout_s)
    session.refresh(existing)
    if existing.request_hash != request_hash:
        raise InvalidRequestError(
            f"Idempotency-Key {key!r} was already used with a different request body",
            code="idempotency-key-reused",
        )
    if existing.state == "completed" and existing.job_id is not None:
        return None, get_job(session, job_id=existing.job_id)
    if utc_now() - existing.updated_at < timedelta(seconds=timeout_s):
        raise ConflictError(
            f"a request with Idempotency-Key {key!r} is still in flight; retry later",
            code="idempotency-key-in-flight",
        )
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
        raise ConflictError(
            f"a request with Idempotency-Key {key!r} is still in flight; retry later",
            code="idempotency-key-in-flight",
        )
    return existing, None


# --- read ---------------------------------------------------------------------------------------------


def get_job(session: Session, *, job_id: str) -> ReconfigurationJob:
    job = session.get(ReconfigurationJob, job_id, populate_existing=True)
    if job is None:
        raise JobNotFoundError(f"no reconfiguration {job_id!r}", job_id=job_id)
    return job


def job_public(session: Session, job: ReconfigurationJob) -> JobPublic:
    deployment = session.get(Deployment, job.deployment_id)
    return JobPublic.from_row(job, deployment_name=deployment.name if deployment else "")


def list_events(session: Session, *, job_id: str, after_seq: int = 0) -> list[JobEvent]:
    return list(
        session.exec(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.seq > after_seq)
            .order_by(col(JobEvent.seq))
        ).all()
    )


def job_detail(session: Session, *, job_id: str) -> JobDetail:
    job = get_job(session, job_id=job_id)
    events = [JobEventPublic.from_row(e) for e in list_events(session, job_id=job_id)]
    return JobDetail(**job_public(session, job).model_dump(), events=events)


def active_job(session: Session, *, deployment_id: str) -> ReconfigurationJob | None:
    job_id = active_job_id(session, deployment_id=deployment_id)
    return None if job_id is None else get_job(session, job_id=job_id)


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
) -> JobList:
    """Newest first. `cursor` is the `next_cursor` of the previous page.

    `count` is exact on the first page (no cursor); the cursor carries it on, so later pages repeat the
    first page's figure instead of counting every matching row again. A cursor without a count (or one
    made under other filters) counts afresh."""
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
    count = position.count if position is not None else None
    if count is None:
        count = session.exec(select(func.count()).select_from(ReconfigurationJob).where(*filters)).one()
    page = select(ReconfigurationJob).where(*filters)
    if position is not None:
        page = page.where(col(ReconfigurationJob.id) < position.after_id)
    rows = list(session.exec(page.order_by(col(ReconfigurationJob.id).desc()).limit(limit + 1)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    names = dict(session.exec(select(Deployment.id, Deployment.name)).all())
    return JobList(
        data=[JobPublic.from_row(r, deployment_name=names.get(r.deployment_id, "")) for r in rows],
        count=count,
        next_cursor=_encode_cursor(rows[-1].id, count, filter_key) if more and rows else None,
    )


@dataclass(frozen=True)
class _CursorPosition:
    after_id: str  # the last job id of the previous page
    count: int | None  # the first page's count, when the cursor carries one for these filters


def _filter_key(*filters: object) -> str:
    """A short digest of the filters, so a count is carried only to pages of the same query."""
    text = "|".join(
        "" if f is None else (f.isoformat() if isinstance(f, datetime) else str(f)) for f in filters
    )
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _encode_cursor(job_id: str, count: int, filter_key: str) -> str:
    # "<job id>~<count>~<filter key>"; job ids are Crockford base32, never "~".
    payload = f"{job_id}~{count}~{filter_key}"
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, filter_key: str) -> _CursorPosition:
    """Accepts this version's cursors and the bare job id of earlier ones (which carry no count)."""
    try:
        payload = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        payload = ""
    job_id, *extra = payload.split("~")
    count: int | None = None
    if len(extra) == 2 and extra[0].isdigit() and extra[1] == filter_key:
        count = int(extra[0])
    if not job_id.startswith(JOB_ID_PREFIX + "_") or len(extra) not in (0, 2):
        raise InvalidRequestError(
            "malformed cursor: pass a next_cursor value unchanged", code="invalid-cursor"
        )
    return _CursorPosition(after_id=job_id, count=count)


# --- cancel -------------------------------------------------------------------------------------------


def cancel_job(session: Session, *, job_id: str, requester: str | None = None) -> CancelOutcome:
    """Pending: cancelled at once. Preparing/syncing: `cancel_requested` is set and the runner rolls the job
    back and ends it `cancelled`. Committing or later: refused (commit cannot be undone halfway)."""
    who = f" by {requester}" if requester else ""
    for _ in range(3):  # the runner may move the job while we decide; re-read and decide again
        job = get_job(session, job_id=job_id)
        state = JobState(job.state)
        if state is JobState.cancelled:
            return CancelOutcome(job, True)
        if state is JobState.pending:
            try:
                job = transition(
                    session,
                    job_id=job_id,
                    from_state=state,
                    to_state=JobState.cancelled,
                    message=f"cancelled{who} before it started",
                )
                return CancelOutcome(job, True)
            except StaleTransitionError:
                continue
        if state in CANCELLABLE_STATES:
            if job.cancel_requested:
                return CancelOutcome(job, False)
            try:
                append_event(
                    session,
                    job_id=job_id,
                    kind="cancel_requested",
                    message=f"cancel requested{who}",
                    changes={"cancel_requested": True},
                    expected_states=[state],
                )
                return CancelOutcome(get_job(session, job_id=job_id), False)
            except ConflictError:
                continue
        reason = "it has finished" if state in TERMINAL_STATES else "commit has started"
        raise ConflictError(
            f"reconfiguration {job_id} is {state}: cannot cancel, {reason}",
            code="not-cancellable",
            job_id=job_id,
            state=state.value,
        )
    raise ConflictError(f"reconfiguration {job_id} keeps changing state; retry", code="not-cancellable")
