"""The job state machine: allowed edges only, compare-and-set, and a log that always agrees with the job."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import Session, col, select

from app.core.errors import ConflictError
from app.jobs.models import JobEvent, ReconfigurationJob
from app.jobs.service import cancel_job
from app.jobs.states import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    CancelPendingError,
    IllegalTransitionError,
    JobNotFoundError,
    JobState,
    StaleTransitionError,
)
from app.jobs.transitions import append_event, transition
from app.webhooks.models import EventType, OutboxEvent
from tests.support.factories import make_deployment, make_job

# The compare-and-set transition and its log rows are the database's behaviour.
pytestmark = pytest.mark.databases("sqlite", "postgres")

S = JobState
_names = (f"d{i}" for i in itertools.count())


def _events(session: Session, job_id: str) -> list[JobEvent]:
    return list(session.exec(select(JobEvent).where(JobEvent.job_id == job_id).order_by(col(JobEvent.seq))))


def _outbox_types(session: Session, job_id: str) -> list[str]:
    rows = session.exec(select(OutboxEvent).where(OutboxEvent.job_id == job_id).order_by(col(OutboxEvent.id)))
    return [row.type for row in rows]


def _job(session: Session) -> ReconfigurationJob:
    return make_job(session, make_deployment(session, next(_names)), 2)


def test_terminal_states_have_no_way_out() -> None:
    assert all(ALLOWED_TRANSITIONS[state] == frozenset() for state in TERMINAL_STATES)
    assert {S.succeeded, S.rolled_back, S.failed, S.cancelled} == TERMINAL_STATES


def test_the_happy_path_records_every_phase_with_start_and_end(session: Session) -> None:
    job = _job(session)
    path = [S.preparing, S.syncing, S.committing, S.cleaning_up, S.succeeded]
    for before, after in itertools.pairwise([S.pending, *path]):
        job = transition(session, job_id=job.id, from_state=before, to_state=after)
    assert job.state == S.succeeded
    assert set(job.phases) == {"preparing", "syncing", "committing", "cleaning_up"}
    assert all(times["started_at"] and times["ended_at"] for times in job.phases.values())
    assert job.started_at is not None and job.finished_at is not None and job.finished_at.tzinfo is not None
    assert [e.seq for e in _events(session, job.id)] == [1, 2, 3, 4, 5, 6]


def test_illegal_transition_changes_nothing_and_says_why(session: Session) -> None:
    job = _job(session)
    with pytest.raises(IllegalTransitionError, match="pending -> committing is not allowed"):
        transition(session, job_id=job.id, from_state=S.pending, to_state=S.committing)
    session.expire_all()
    assert session.get(ReconfigurationJob, job.id).state == S.pending  # type: ignore[union-attr]
    assert len(_events(session, job.id)) == 1


def test_stale_transition_changes_nothing_and_names_the_current_state(session: Session) -> None:
    job = _job(session)
    transition(session, job_id=job.id, from_state=S.pending, to_state=S.preparing)
    with pytest.raises(StaleTransitionError) as stale:
        transition(session, job_id=job.id, from_state=S.pending, to_state=S.cancelled)
    assert stale.value.current_state is S.preparing
    assert "is preparing, not pending" in str(stale.value)
    assert [e.to_state for e in _events(session, job.id)] == ["pending", "preparing"]


def test_leaving_the_cancellable_states_over_a_pending_cancel_is_refused(session: Session) -> None:
    job = _job(session)
    for before, after in itertools.pairwise([S.pending, S.preparing, S.syncing]):
        transition(session, job_id=job.id, from_state=before, to_state=after)
    assert not cancel_job(session, job_id=job.id).immediate  # accepted: the runner must honour it
    seqs = [e.seq for e in _events(session, job.id)]
    with pytest.raises(CancelPendingError) as caught:
        transition(session, job_id=job.id, from_state=S.syncing, to_state=S.committing)
    assert caught.value.code == "cancel-pending"
    row = session.get(ReconfigurationJob, job.id, populate_existing=True)
    assert row is not None and row.state == S.syncing
    assert [e.seq for e in _events(session, job.id)] == seqs
    # The ways out that honour the cancel stay open.
    transition(session, job_id=job.id, from_state=S.syncing, to_state=S.cancelled)


def test_a_cancel_after_the_move_to_committing_is_refused_as_too_late(session: Session) -> None:
    job = _job(session)
    for before, after in itertools.pairwise([S.pending, S.preparing, S.syncing, S.committing]):
        transition(session, job_id=job.id, from_state=before, to_state=after)
    with pytest.raises(ConflictError) as caught:
        cancel_job(session, job_id=job.id)
    assert caught.value.code == "not-cancellable"
    row = session.get(ReconfigurationJob, job.id, populate_existing=True)
    assert row is not None and not row.cancel_requested


def test_transition_of_an_unknown_job_is_not_found(session: Session) -> None:
    with pytest.raises(JobNotFoundError):
        transition(session, job_id="rcfg_missing", from_state=S.pending, to_state=S.preparing)


def test_transitions_write_the_webhook_outbox_in_the_same_transaction(session: Session) -> None:
    job = _job(session)
    transition(session, job_id=job.id, from_state=S.pending, to_state=S.preparing)
    transition(session, job_id=job.id, from_state=S.preparing, to_state=S.syncing)
    transition(session, job_id=job.id, from_state=S.syncing, to_state=S.rolled_back)
    assert _outbox_types(session, job.id) == [
        EventType.started,
        EventType.phase_changed,
        EventType.rolled_back,
    ]
    payload = session.exec(select(OutboxEvent).where(OutboxEvent.type == EventType.rolled_back)).one().payload
    assert payload["type"] == "reconfiguration.rolled_back"
    assert payload["data"]["id"] == job.id and payload["data"]["state"] == "rolled_back"


def test_append_event_takes_the_next_seq_and_may_change_progress(session: Session) -> None:
    job = _job(session)
    transition(session, job_id=job.id, from_state=S.pending, to_state=S.preparing)
    event = append_event(
        session,
        job_id=job.id,
        kind="progress",
        message="sending weights",
        changes={"progress_step": "weights", "progress_percent": 40.0},
    )
    assert event.seq == 3
    session.expire_all()
    stored = session.get(ReconfigurationJob, job.id)
    assert stored is not None and (stored.progress_step, stored.progress_percent) == ("weights", 40.0)


def test_append_event_may_write_an_outbox_row(session: Session) -> None:
    job = _job(session)
    append_event(session, job_id=job.id, kind="cleanup", outbox_type=EventType.cleanup_failed.value)
    assert _outbox_types(session, job.id) == [EventType.cleanup_failed]


def test_transitions_refuse_to_change_protected_columns(session: Session) -> None:
    job = _job(session)
    with pytest.raises(Exception, match="cannot change to_dp_size"):
        transition(
            session, job_id=job.id, from_state=S.pending, to_state=S.preparing, changes={"to_dp_size": 7}
        )
    assert len(_events(session, job.id)) == 1


@settings(
    max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(attempts=st.lists(st.tuples(st.sampled_from(list(JobState)), st.booleans()), max_size=12))
def test_random_transition_sequences_keep_the_log_and_the_job_in_agreement(
    session: Session, attempts: list[tuple[JobState, bool]]
) -> None:
    """Each attempt targets a random state, from the job's real state or (stale) from a random one."""
    job = _job(session)
    state = S.pending
    for target, use_real_state in attempts:
        claimed = state if use_real_state else next(s for s in JobState if s != target)
        try:
            transition(session, job_id=job.id, from_state=claimed, to_state=target)
        except (IllegalTransitionError, StaleTransitionError):
            legal = target in ALLOWED_TRANSITIONS[claimed]
            assert not legal or claimed != state  # refused only when illegal or stale
            continue
        assert claimed == state and target in ALLOWED_TRANSITIONS[state]
        state = target

    session.expire_all()
    stored = session.get(ReconfigurationJob, job.id)
    assert stored is not None
    events = _events(session, job.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert stored.last_event_seq == len(events)
    chain = [e for e in events if e.kind == "transition"]
    previous = S.pending
    for event in chain:
        assert event.from_state == previous
        assert JobState(event.to_state or "") in ALLOWED_TRANSITIONS[previous]
        previous = JobState(event.to_state or "")
    assert stored.state == previous == state
    assert len(_outbox_types(session, job.id)) == len(chain)
    assert (stored.finished_at is not None) == (state in TERMINAL_STATES)
