"""The reconfiguration job state machine as a pure table: states, allowed moves, terminal sets, and the
errors a refused move raises. No database here, so the models import it without a cycle; the one
writer of transitions is `app.jobs.transitions`.

    pending -> preparing -> syncing -> committing -> cleaning_up -> succeeded
    terminal: succeeded, rolled_back, failed, cancelled

Cancel works until commit starts. The move from a cancellable state into a later, non-cancellable one
(`syncing -> committing`) happens only while no cancel is pending: the writer checks the job's
`cancel_requested` in the same compare-and-set, so a cancel racing that move either wins (the runner
then rolls the job back, `cancelled`) or arrives after it and is refused as too late (409
`not-cancellable`). A cancel is never accepted and then ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from app.core.errors import ConflictError, NotFoundError


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
        "client_outage_ms",
        "client_slowest_answer_ms",
        "probe",
        "front_door_requests",
        "error",
        "cleanup_state",
        "cleanup",
        "cancel_requested",
        "lease_owner",
        "lease_expires_at",
        "to_generation",
        "placement",
        "coverage",
        "time_to_serving_ms",
        "reached_dp_size",
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


def guards_cancel(from_state: JobState, to_state: JobState) -> bool:
    """Whether this move must not happen over a pending cancel: it leaves the cancellable states for a
    later phase (`syncing -> committing`), after which a cancel can no longer be honoured."""
    return from_state in CANCELLABLE_STATES and to_state not in CANCELLABLE_STATES | TERMINAL_STATES


class CancelPendingError(TransitionError):
    """The move would leave the cancellable states while a cancel is pending: not performed, so the
    runner honours the cancel instead."""

    code = "cancel-pending"
