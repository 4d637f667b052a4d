"""Pure pieces of crash recovery and cleanup tracking."""

from __future__ import annotations

import time

from app.backends.reference.cleanup import outcome_for
from app.backends.reference.recovery import plan_from_job
from app.jobs.models import ReconfigurationJob
from engine_agent.protocol import CleanupRecord, CleanupState, CleanupStatus


def record(job_id: str, ok: bool) -> CleanupRecord:
    return CleanupRecord(
        job_id=job_id,
        generation=3,
        ok=ok,
        error=None if ok else "boom",
        duration_ms=1.0,
        finished_at=time.time(),
    )


def test_a_failure_of_this_jobs_cleanup_is_failed() -> None:
    status = CleanupStatus(
        state=CleanupState.failed, failure=record("j1", False), recent=[record("j1", False)]
    )
    assert outcome_for("j1", status)[0] == "failed"


def test_a_later_successful_retry_wins_over_the_old_failure() -> None:
    status = CleanupStatus(state=CleanupState.idle, recent=[record("j1", True), record("j1", False)])
    assert outcome_for("j1", status)[0] == "succeeded"


def test_queued_generations_mean_running() -> None:
    status = CleanupStatus(state=CleanupState.running, pending_generations=[3])
    assert outcome_for("j1", status)[0] == "running"


def test_another_jobs_failure_is_not_this_jobs() -> None:
    status = CleanupStatus(
        state=CleanupState.failed, failure=record("j0", False), recent=[record("j1", True)]
    )
    assert outcome_for("j1", status)[0] == "succeeded"


def test_recovery_rebuilds_the_participants_from_the_jobs_engine_results() -> None:
    job = ReconfigurationJob(
        id="j1",
        deployment_id="d",
        from_dp_size=2,
        to_dp_size=2,
        from_generation=4,
        to_generation=5,
        requested_by="api",
        warmup_policy="eager",
        warmup_policy_requested="auto",
        strategy="background",
        engine_results=[
            {"engine_id": "a", "url": "http://a", "role": "staying", "old_rank": 0, "new_rank": 0},
            {"engine_id": "b", "url": "http://b", "role": "leaving", "old_rank": 1, "new_rank": None},
            {"engine_id": "c", "url": "http://c", "role": "joining", "old_rank": None, "new_rank": 1},
        ],
    )
    plan = plan_from_job(job)
    assert plan is not None
    assert [m.engine_id for m in plan.old_members] == ["a", "b"]
    assert [m.engine_id for m in plan.members] == ["a", "c"]
    assert (plan.joiners, plan.leavers) == (["c"], ["b"])
    assert (plan.old_generation, plan.generation) == (4, 5)
    assert [m.engine_id for m in plan.participants] == ["a", "b", "c"]


def test_a_job_that_never_planned_has_nothing_to_recover_on_agents() -> None:
    job = ReconfigurationJob(
        id="j1",
        deployment_id="d",
        from_dp_size=2,
        to_dp_size=3,
        from_generation=4,
        to_generation=5,
        requested_by="api",
        warmup_policy_requested="auto",
        strategy="background",
    )
    assert plan_from_job(job) is None
