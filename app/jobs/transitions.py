"""The one writer of a job's record: each transition is one transaction.

A transition is a compare-and-set `UPDATE ... WHERE id = :id AND state = :from` (and, for the move out
of the cancellable states, `AND NOT cancel_requested`) that also bumps the job's event counter, the
event-log row carrying that counter as its `seq`, and (for the transitions webhooks announce) an outbox
row. An illegal or stale transition changes nothing and raises a `TransitionError` that says why.
`append_event` adds non-transition rows (progress, plan, engines, cleanup notes) to the same log with
the next `seq`. The table itself (states, allowed moves) is `app.jobs.states`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from app.core.clock import utc_now
from app.core.errors import ConflictError, InvalidRequestError
from app.deployments.models import Deployment
from app.jobs.models import JobError, JobEvent, JobPublic, ReconfigurationJob
from app.jobs.states import (
    ALLOWED_TRANSITIONS,
    MUTABLE_FIELDS,
    PHASE_STATES,
    TERMINAL_STATES,
    CancelPendingError,
    IllegalTransitionError,
    JobNotFoundError,
    JobState,
    StaleTransitionError,
    guards_cancel,
    is_allowed,
)
from app.webhooks.models import EventType
from app.webhooks.outbox import enqueue_event

S = JobState


def outbox_event_type(from_state: JobState, to_state: JobState) -> str | None:
    """The webhook event a transition announces."""
    if to_state in TERMINAL_STATES:
        return EventType(f"reconfiguration.{to_state.value}").value
    if from_state is S.pending and to_state is S.preparing:
        return EventType.started.value
    return EventType.phase_changed.value


def transition(
    session: Session,
    *,
    job_id: str,
    from_state: JobState,
    to_state: JobState,
    message: str | None = None,
    data: Mapping[str, Any] | None = None,
    changes: Mapping[str, Any] | None = None,
) -> ReconfigurationJob:
    """Move a job `from_state -> to_state`, append the log row and the outbox row, commit; return the job.

    `changes` sets other job columns (see MUTABLE_FIELDS) in the same UPDATE; `error` is a `JobError`. Raises
    IllegalTransitionError, StaleTransitionError, CancelPendingError (leaving the cancellable states
    while a cancel is pending) or JobNotFoundError with nothing written.
    """
    from_state, to_state = JobState(from_state), JobState(to_state)
    if not is_allowed(from_state, to_state):
        allowed = ", ".join(sorted(ALLOWED_TRANSITIONS[from_state])) or "none: it is terminal"
        raise IllegalTransitionError(
            f"job {job_id}: {from_state} -> {to_state} is not allowed (from {from_state}: {allowed})",
            job_id=job_id,
            from_state=from_state,
            to_state=to_state,
        )
    values = _checked_changes(changes)
    try:
        job = session.get(ReconfigurationJob, job_id, populate_existing=True)
        if job is None:
            raise JobNotFoundError(f"no reconfiguration {job_id}", job_id=job_id)
        if job.state != from_state:
            raise _stale(job_id, from_state, to_state, JobState(job.state))
        guarded = guards_cancel(from_state, to_state)
        if guarded and job.cancel_requested:
            raise _cancel_pending(job_id, from_state, to_state)
        now = utc_now()
        phases = {name: dict(times) for name, times in (job.phases or {}).items()}
        if from_state in PHASE_STATES:
            phases.setdefault(from_state.value, {"started_at": None})["ended_at"] = now.isoformat()
        if to_state in PHASE_STATES:
            phases[to_state.value] = {"started_at": now.isoformat(), "ended_at": None}
        values.setdefault("phases", phases)
        values["state"] = to_state.value
        values["updated_at"] = now
        if from_state is S.pending:
            values["started_at"] = now
        if to_state in TERMINAL_STATES:
            values["finished_at"] = now
            values["lease_owner"] = None
            values["lease_expires_at"] = None
        seq = _bump(session, job_id, values, expected_states=[from_state], no_pending_cancel=guarded)
        if seq is None:  # someone else moved it (or asked to cancel it) between our read and our write
            session.rollback()
            current = session.get(ReconfigurationJob, job_id, populate_existing=True)
            if current is None:
                raise JobNotFoundError(f"no reconfiguration {job_id}", job_id=job_id)
            if current.state == from_state and guarded and current.cancel_requested:
                raise _cancel_pending(job_id, from_state, to_state)
            raise _stale(job_id, from_state, to_state, JobState(current.state))
        session.add(
            JobEvent(
                job_id=job_id,
                seq=seq,
                kind="transition",
                from_state=from_state.value,
                to_state=to_state.value,
                message=message,
                data=dict(data) if data else None,
                created_at=now,
            )
        )
        job = session.get(ReconfigurationJob, job_id, populate_existing=True)
        assert job is not None
        event_type = outbox_event_type(from_state, to_state)
        if event_type is not None:
            _add_outbox(session, job, event_type)
        session.commit()
        return job
    except BaseException:
        session.rollback()
        raise


def append_event(
    session: Session,
    *,
    job_id: str,
    kind: str,
    message: str | None = None,
    data: Mapping[str, Any] | None = None,
    changes: Mapping[str, Any] | None = None,
    outbox_type: str | None = None,
    expected_states: Collection[JobState] | None = None,
) -> JobEvent:
    """Append a non-transition row (kind 'progress', 'phase', 'engine', 'cleanup', ...) with the next seq,
    optionally changing job columns and writing an outbox row, in one transaction; commit.

    With `expected_states`, the job must be in one of them (else `ConflictError`, nothing written):
    e.g. progress only while the job is still running.
    """

    if kind == "transition":
        raise InvalidRequestError("transitions go through transition()", code="invalid-event-kind")
    values = _checked_changes(changes)
    now = utc_now()
    values["updated_at"] = now
    try:
        seq = _bump(session, job_id, values, expected_states=expected_states)
        if seq is None:
            session.rollback()
            current = session.get(ReconfigurationJob, job_id, populate_existing=True)
            if current is None:
                raise JobNotFoundError(f"no reconfiguration {job_id}", job_id=job_id)
            expected = ", ".join(sorted(JobState(s) for s in expected_states or ()))
            raise ConflictError(
                f"job {job_id} is {current.state}, not one of: {expected}",
                code="job-state-changed",
                job_id=job_id,
                current_state=current.state,
            )
        event = JobEvent(
            job_id=job_id,
            seq=seq,
            kind=kind,
            message=message,
            data=dict(data) if data else None,
            created_at=now,
        )
        session.add(event)
        if outbox_type is not None:
            job = session.get(ReconfigurationJob, job_id, populate_existing=True)
            assert job is not None
            _add_outbox(session, job, outbox_type)
        session.commit()
        return event
    except BaseException:
        session.rollback()
        raise


def _checked_changes(changes: Mapping[str, Any] | None) -> dict[str, Any]:
    values = dict(changes or {})
    unknown = set(values) - MUTABLE_FIELDS
    if unknown:
        raise InvalidRequestError(
            f"cannot change {', '.join(sorted(unknown))} here (allowed: {', '.join(sorted(MUTABLE_FIELDS))})",
            code="immutable-job-field",
        )
    if "error" in values:  # the job's error is a `JobError` up to here; the row keeps its JSON
        error = values["error"]
        if not isinstance(error, JobError | None):
            raise TypeError(f"a job's error is a JobError, not {type(error).__name__}")
        values["error"] = error.stored() if error is not None else None
    return values


def _bump(
    session: Session,
    job_id: str,
    values: dict[str, Any],
    *,
    expected_states: Collection[JobState] | None,
    no_pending_cancel: bool = False,
) -> int | None:
    """The compare-and-set UPDATE: apply `values`, count one more event, return that event's seq
    (None when no row matched)."""
    table = ReconfigurationJob.__table__  # type: ignore[attr-defined]
    statement = sa.update(table).where(table.c.id == job_id)
    if expected_states is not None:
        states = [JobState(s).value for s in expected_states]
        statement = statement.where(table.c.state.in_(states))
    if no_pending_cancel:
        statement = statement.where(table.c.cancel_requested.is_(False))
    statement = statement.values(last_event_seq=table.c.last_event_seq + 1, **values)
    row = session.execute(statement.returning(table.c.last_event_seq)).first()
    return None if row is None else int(row[0])


def _cancel_pending(job_id: str, from_state: JobState, to_state: JobState) -> CancelPendingError:
    return CancelPendingError(
        f"job {job_id}: a cancel is pending, so {from_state} -> {to_state} was not performed",
        job_id=job_id,
        from_state=from_state,
        to_state=to_state,
    )


def _stale(job_id: str, from_state: JobState, to_state: JobState, current: JobState) -> StaleTransitionError:
    return StaleTransitionError(
        f"job {job_id} is {current}, not {from_state}: {from_state} -> {to_state} not performed",
        job_id=job_id,
        from_state=from_state,
        to_state=to_state,
        current_state=current,
    )


def _add_outbox(session: Session, job: ReconfigurationJob, event_type: str) -> None:
    deployment = session.get(Deployment, job.deployment_id)
    summary = JobPublic.of(job, deployment=deployment.name if deployment else "")
    enqueue_event(
        session, event_type, summary.model_dump(mode="json"), deployment_id=job.deployment_id, job_id=job.id
    )
