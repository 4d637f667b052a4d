"""A job's steps at the deployment's front door, in the order the issue asks (issue 35):

- before `prepare` (a leaver stops admitting there): the plan's leavers `draining`, and the job waits
  until the front door applied it, so no new request reaches an engine that would refuse it;
- once every member confirmed serving the new generation (the observed commit): the new rank set
  (joiners `ready` only now, leavers `out`), written with the job's results saying so, and applied
  while the coordinator's move records the generation (that move derives the same set); the job waits
  for it before the leavers are released;
- before a job ends on the old generation (rolled back, cancelled), once its engines resumed: the rank
  set as it was before the job.

Each step is on the job's log (`front-door`) with the time the front door took to apply it. A front
door that does not answer never fails a job: the step says so and the job goes on (HAProxy's retries
send a refused request to another engine)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlmodel import Session

from app.backends.base import JobMovedOn
from app.backends.reference.job import JobRun
from app.backends.reference.record import JobRecord
from app.frontdoor import service
from app.frontdoor.keeper import KEEPERS, counters_of
from app.frontdoor.models import EndpointPublic
from app.frontdoor.publish import DoorStep, publish, serve_ahead, settle, write
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
    """The leavers `draining`; then, where this coordinator keeps the front door, the requests they
    held when drained are counted and followed until they finished (up to `DRAIN_WAIT_S`)."""
    if run.plan is None or not run.plan.leavers:
        return
    leavers = sorted(run.plan.leavers)
    step = await front_door_step(record, run, f"drain leavers {', '.join(leavers)}")
    if step is None or not step.applied:
        return
    drained = await follow_drain(run.deployment_id, leavers)
    if drained is not None:
        held = sum(d["in_flight_at_drain"] for d in drained.values())
        longest = max((d["drained_ms"] or 0.0 for d in drained.values()), default=0.0)
        with contextlib.suppress(JobMovedOn):
            await record.note(
                run,
                "front-door",
                f"leavers drained: {held} requests in flight at the drain, all done in {longest:.1f} ms",
                changes={"front_door_requests": {"drained": drained}},
            )


DRAIN_WAIT_S = 2.0


async def follow_drain(deployment_id: str, leavers: list[str]) -> dict[str, dict[str, Any]] | None:
    """Per leaver: requests in flight at the drain (HAProxy's `scur`) and how long until none was
    (None: still some at `DRAIN_WAIT_S`); None where no keeper of this front door runs here."""
    started = time.monotonic()
    first = await counters_of(deployment_id)
    if first is None:
        return None
    engines = first.get("engines", {})
    drained = {
        e: {"in_flight_at_drain": engines.get(e, {}).get("scur", 0), "drained_ms": None} for e in leavers
    }
    now: dict[str, Any] | None = first
    while True:
        elapsed_ms = (time.monotonic() - started) * 1000.0
        in_flight = (now or {}).get("engines", {})
        for engine_id, entry in drained.items():
            if entry["drained_ms"] is None and in_flight.get(engine_id, {}).get("scur", 0) == 0:
                entry["drained_ms"] = round(elapsed_ms, 1)
        if all(e["drained_ms"] is not None for e in drained.values()) or elapsed_ms > DRAIN_WAIT_S * 1000:
            return drained
        await asyncio.sleep(0.01)
        now = await counters_of(deployment_id)


NEW_RANK_SET = "new rank set"


def prederive(record: JobRecord, run: JobRun) -> None:
    """As the commit is armed (before the window): the rank set the job's results will make the feed
    say once every member switched, derived now (reads only; `service.derive_switched`), so that at
    the observed commit the front door is given it in one Runtime API exchange and nothing else. Only
    where a keeper of the deployment's front door runs here."""
    if KEEPERS.get(run.deployment_id) is None:
        return
    results, state = run.engine_results(ended_on="new"), run.state.value

    def derive(session: Session) -> list[EndpointPublic] | None:
        return service.derive_switched(session, run.deployment_id, run.job_id, state, results)

    task = asyncio.ensure_future(record.run_in_session(derive))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a failure here is only a miss
    run.rank_set_ahead = task


async def _rank_set_ahead(run: JobRun) -> list[EndpointPublic] | None:
    task, run.rank_set_ahead = run.rank_set_ahead, None
    if task is None:
        return None
    try:
        result: list[EndpointPublic] | None = await task
    except Exception:
        return None
    return result


async def commit_observed(record: JobRecord, run: JobRun) -> asyncio.Task[DoorStep] | None:
    """Every member confirmed serving the new generation: nothing can take the job back to the old one
    now, so its results say so at once (only while it is still `committing`: a job moved on by another
    coordinator writes nothing) and the feed's new rank set is written from them, before the move that
    records the generation. The task: the front door applying it (None where the write failed: the
    step after the move publishes it then)."""
    results = run.engine_results(ended_on="new")
    state = run.state.value

    def switched(session: Session) -> None:
        job = session.get(ReconfigurationJob, run.job_id)
        if job is not None and job.state == state:
            job.engine_results = results
            session.add(job)
            session.commit()

    try:
        # HAProxy gets the new rank set first; the write may wait for the database's write lock.
        derived = await _rank_set_ahead(run)
        ahead = await serve_ahead(
            record.run_in_session, run.deployment_id, (run.job_id, state), results, derived=derived
        )
        written = await write(record.run_in_session, run.deployment_id, before=switched, ahead=ahead)
    except Exception:  # never fails the job
        log.warning("job %s: publishing the observed commit failed", run.job_id, exc_info=True)
        return None
    return asyncio.create_task(settle(record.run_in_session, run.deployment_id, NEW_RANK_SET, written))


async def new_rank_set(record: JobRecord, run: JobRun, early: asyncio.Task[DoorStep] | None = None) -> None:
    """The new rank set applied (`early`: published at the observed commit) and on the job's log."""
    if early is None:
        await front_door_step(record, run, NEW_RANK_SET)
        return
    try:
        step = await early
    except Exception:
        log.warning("job %s: front door step %r failed", run.job_id, NEW_RANK_SET, exc_info=True)
        return
    if step.front_door:
        with contextlib.suppress(JobMovedOn):
            await record.note(run, "front-door", step.message(), data=step.data())


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
