"""A job's steps at the deployment's front door, in the order the issue asks (issue 35):

- before `prepare` (a leaver stops admitting there): the plan's leavers `draining`, and the job waits
  until the front door applied it, so no new request reaches an engine that would refuse it;
- after the switch is recorded (`cleaning_up`): the new rank set (joiners `ready` only now, leavers
  `out`), before the leavers are released;
- before a job ends on the old generation (rolled back, cancelled), once its engines resumed: the rank
  set as it was before the job.

Each step is on the job's log (`front-door`) with the time the front door took to apply it. A front
door that does not answer never fails a job: the step says so and the job goes on (HAProxy's retries
send a refused request to another engine)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from sqlmodel import Session

from app.backends.base import JobMovedOn
from app.backends.reference.job import JobRun
from app.backends.reference.record import JobRecord
from app.frontdoor.publish import DoorStep, publish
from app.jobs.models import ReconfigurationJob

log = logging.getLogger(__name__)


async def front_door_step(
    record: JobRecord, run: JobRun, what: str, before: Callable[[Session], None] | None = None
) -> DoorStep | None:
    """Publish and wait; on the job's log where the deployment has a front door (without one the
    feed's versions are the record, and routers follow them at their own pace)."""
    try:
        step = await publish(record.run_in_session, run.deployment_id, what, before=before)
    except Exception:  # never fails the job
        log.warning("job %s: front door step %r failed", run.job_id, what, exc_info=True)
        return None
    if step.front_door:
        with contextlib.suppress(JobMovedOn):
            await record.note(run, "front-door", step.message(), data=step.data())
    return step


async def drain_leavers(record: JobRecord, run: JobRun) -> None:
    if run.plan is not None and run.plan.leavers:
        await front_door_step(record, run, f"drain leavers {', '.join(sorted(run.plan.leavers))}")


async def new_rank_set(record: JobRecord, run: JobRun) -> None:
    await front_door_step(record, run, "new rank set")


async def rank_set_restored(record: JobRecord, run: JobRun) -> None:
    """Before the job ends on the old generation (its engines resumed): its results say so, and the
    leavers are ready again."""
    if run.plan is None:
        return
    results = run.engine_results(ended_on="old")

    def ended_on_old(session: Session) -> None:
        job = session.get(ReconfigurationJob, run.job_id)
        if job is not None:
            job.engine_results = results
            session.add(job)
            session.commit()

    await front_door_step(record, run, "rank set as before the job", before=ended_on_old)
