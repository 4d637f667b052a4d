"""The reconfiguration job state machine: states, allowed transitions, and the one function that
performs a transition.

    pending -> preparing -> syncing -> committing -> cleaning_up -> succeeded
    terminal: succeeded, rolled_back, failed, cancelled

A transition is one transaction: a compare-and-set `UPDATE ... WHERE id = :id AND state = :from` that
also bumps the job's event counter, the event-log row carrying that counter as its `seq`, and (for the
transitions webhooks announce) an outbox row. An illegal or stale transition changes nothing and raises
a `TransitionError` that says why. `append_event` adds non-transition rows (progress, phase, engine,
cleanup notes) to the same log with the next `seq`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlmodel import Session

from app.core.clock import utc_now
from app.core.errors import ConflictError, InvalidRequestError, NotFoundError
from app.core.ids import new_id

if TYPE_CHECKING:
    from app.jobs.models import JobEvent, ReconfigurationJob


class JobState(StrEnum):
    pending = "pending"
    preparing = "preparing"
    syncing = "syncing"
    committing = "committing"
    cleaning_up = "cleaning_up"
    succeeded = "succeeded"
    rolled_back = "rolled_back"
    failed = "failed"
    cancelled = "cancelled"


S = JobState
TERMINAL_STATES: frozenset[JobState] = frozenset({S.succeeded, S.rolled_back, S.failed, S.cancelled})
ACTIVE_STATES: frozenset[JobState] = frozenset(JobState) - TERMINAL_STATES
# Cancel works until commit starts: a pending job is cancelled at once, a preparing/syncing one on
# request (the runner rolls it back and ends it `cancelled`).
CANCELLABLE_STATES: frozenset[JobState] = frozenset({S.pending, S.preparing, S.syncing})
# The states that are phases of the work; entering one records its start, leaving it its end.
PHASE_STATES: tuple[JobState, ...] = (S.preparing, S.syncing, S.committing, S.cleaning_up)

ALLOWED_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    S.pending: frozenset({S.preparing, S.cancelled, S.failed}),
    S.preparing: frozenset({S.syncing, S.rolled_back, S.cancelled, S.failed}),
    S.syncing: frozenset({S.committing, S.rolled_back, S.cancelled, S.failed}),
    S.committing: frozenset({S.cleaning_up, S.rolled_back, S.failed}),
    S.cleaning_up: frozenset({S.succeeded, S.failed}),
    S.succeeded: frozenset(),
    S.rolled_back: frozenset(),
    S.failed: frozenset(),
    S.cancelled: frozenset(),
}

# Columns a transition or an event may change together with its log row. The state, the event counter
# and the timestamps belong to this module alone.
MUTABLE_FIELDS: frozenset[str] = frozenset(
    {
        "warmup_policy",
        "progress_step",
        "progress_percent",
        "phases",
        "engine_results",
        "downtime_ms",
        "downtime",
        "error",
        "cleanup_state",
        "cleanup",
        "cancel_requested",
        "lease_owner",
        "lease_expires_at",
        "to_generation",
    }
)


class TransitionError(ConflictError):
    """A transition that was not performed; nothing changed."""

    code = "invalid-transition"

    def __init__(
        self, detail: str, *, job_id: str, from_state: JobState, to_state: JobState, **extra: Any
    ) -> None:
        super().__init__(detail, job_id=job_id, from_state=from_state.value, to_state=to_state.value, **extra)
        self.job_id = job_id
        self.from_state = from_state
        self.to_state = to_state


class IllegalTransitionError(TransitionError):
    """The state machine has no such edge (e.g. committing -> cancelled, or out of a terminal state)."""

    code = "illegal-transition"


class StaleTransitionError(TransitionError):
    """The job is no longer in the state the caller expected (another actor moved it first)."""

    code = "stale-transition"

    def __init__(
        self, detail: str, *, job_id: str, from_state: JobState, to_state: JobState, current_state: JobState
    ) -> None:
        super().__init__(
            detail, job_id=job_id, from_state=from_state, to_state=to_state, current_state=current_state.value
        )
        self.current_state = current_state


class JobNotFoundError(NotFoundError):
    code = "job-not-found"


def is_allowed(from_state: JobState, to_state: JobState) -> bool:
    return to_state in ALLOWED_TRANSITIONS[from_state]


def outbox_event_type(from_state: JobState, to_state: JobState) -> str | None:
    """The webhook event a transition announces."""
    from app.webhooks.models import EventType

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

    `changes` sets other job columns (see MUTABLE_FIELDS) in the same UPDATE. Raises
    IllegalTransitionError, StaleTransitionError or JobNotFoundError with nothing written.
    """
    from app.jobs.models import JobEvent, ReconfigurationJob

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
        seq = _bump(session, job_id, values, expected_states=[from_state])
        if seq is None:  # someone else moved it between our read and our write
            session.rollback()
            current = session.get(ReconfigurationJob, job_id, populate_existing=True)
            if current is None:
                raise JobNotFoundError(f"no reconfiguration {job_id}", job_id=job_id)
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
    from app.jobs.models import JobEvent, ReconfigurationJob

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
    return values


def _bump(
    session: Session, job_id: str, values: dict[str, Any], *, expected_states: Collection[JobState] | None
) -> int | None:
    """The compare-and-set UPDATE: apply `values`, count one more event, return that event's seq
    (None when no row matched)."""
    from app.jobs.models import ReconfigurationJob

    table = ReconfigurationJob.__table__  # type: ignore[attr-defined]
    statement = sa.update(table).where(table.c.id == job_id)
    if expected_states is not None:
        states = [JobState(s).value for s in expected_states]
        statement = statement.where(table.c.state.in_(states))
    statement = statement.values(last_event_seq=table.c.last_event_seq + 1, **values)
    row = session.execute(statement.returning(table.c.last_event_seq)).first()
    return None if row is None else int(row[0])


def _stale(job_id: str, from_state: JobState, to_state: JobState, current: JobState) -> StaleTransitionError:
    return StaleTransitionError(
        f"job {job_id} is {current}, not {from_state}: {from_state} -> {to_state} not performed",
        job_id=job_id,
        from_state=from_state,
        to_state=to_state,
        current_state=current,
    )


def _add_outbox(session: Session, job: ReconfigurationJob, event_type: str) -> None:
    from app.deployments.models import Deployment
    from app.jobs.models import JobPublic
    from app.webhooks.models import OUTBOX_ID_PREFIX, OutboxEvent

    deployment = session.get(Deployment, job.deployment_id)
    summary = JobPublic.from_row(job, deployment_name=deployment.name if deployment else "")
    now = utc_now()
    session.add(
        OutboxEvent(
            id=new_id(OUTBOX_ID_PREFIX),
            type=event_type,
            job_id=job.id,
            deployment_id=job.deployment_id,
            payload={
                "type": event_type,
                "timestamp": now.isoformat(),
                "data": summary.model_dump(mode="json"),
            },
            created_at=now,
        )
    )
