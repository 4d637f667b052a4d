"""The engine-agreed commit switched in the serving thread: the new generation is handed to `arm` ahead
of the boundary (`serving.ArmedSwitch`), the serving loop installs it at the agreed boundary and steps
on at once, and the job's worker does the window's bookkeeping afterwards. Inside the window there is
then no thread hand-off, no event-loop wake-up and no GIL wait for another thread: the switch and one
lock-step iteration. Used when the window runs no step of its own (eager policy, background strategy),
for a member of both generations, with no downtime verdict to take while stopped; otherwise the
window pauses and switches as before (`window.CommitWindow.arm`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine_agent.protocol import PauseInterval, ReconfigPhase
from engine_agent.reconfig.cleanup import Releasable, RetiredGeneration
from engine_agent.reconfig.faults import FaultSwitches
from engine_agent.reconfig.job import Job
from engine_agent.serving import ArmedSwitch

if TYPE_CHECKING:
    from engine_agent.reconfig.window import CommitWindow

log = logging.getLogger(__name__)


def handoff(job: Job, faults: FaultSwitches, max_downtime_ms: int | None) -> ArmedSwitch | None:
    """The new generation for the serving thread to switch to by itself, or None where the window
    must pause first (a step inside it, a leaver or joiner, a downtime budget, an injected failure)."""
    if not (job.steps.in_old and job.steps.in_new) or job.plan.window or max_downtime_ms is not None:
        return None
    group = job.standby.get("ep")
    if group is None or faults.fail_next_switch_armed():
        return None
    return ArmedSwitch(job.new_generation(group), views=job.views)


def after_switch(window: CommitWindow, job: Job, switched: ArmedSwitch) -> None:
    """The serving thread switched at the boundary: what `pause` and `switch` record, after it."""
    site, request = window.site, job.request
    paused, retired = switched.paused, switched.retired
    assert paused is not None
    job.standby.take_all()  # the engine serves from the group now: no roll-back may destroy it
    job.staged, job.stacks, job.views, job.graphs = {}, {}, None, None
    job.paused_monotonic = paused.monotonic
    job.paused = True
    with site.board.lock:
        window.cancel_lease(job)
        interval = PauseInterval(paused_at=paused.wall, boundary_wait_ms=0.0)
        site.board.update(job, phase=ReconfigPhase.switching, step="switch", pause=interval)
    if retired is not None:  # its groups and graphs go in the background, as after `switch`
        graphs: list[Releasable] = [retired.graphs] if retired.graphs is not None else []
        site.cleanup.submit(RetiredGeneration(request.job_id, retired.generation, [retired.group], graphs))
    if not site.engine.wait_serving(request.timeouts.collective_s):
        log.warning("job %s: generation %s not serving in time", request.job_id, request.generation)
    switch_ms = (switched.switched_monotonic - paused.monotonic) * 1000.0
    window.finish_window(job, switch_ms=switch_ms, resume_started=switched.switched_monotonic)
    site.board.update(job, phase=ReconfigPhase.committed, step=None)
    log.info(
        "job %s: switched to generation %s at the agreed boundary (serving thread)",
        request.job_id,
        request.generation,
    )
