"""The engine-agreed commit switched in the serving thread: the new generation is handed to `arm` ahead
of the boundary (`serving.ArmedSwitch`), the serving loop installs it at the agreed boundary and steps
on at once, and the job's worker does the window's bookkeeping afterwards
(`CommitWindow._after_armed_switch`). Inside the window there is then no thread hand-off, no event-loop
wake-up and no GIL wait for another thread: the switch and one lock-step iteration. Used when the window
runs no step of its own (eager policy, background strategy), for a member of both generations, with no
downtime verdict to take while stopped; otherwise the window pauses and switches as before
(`window.CommitWindow.arm`)."""

from __future__ import annotations

from engine_agent.reconfig.faults import FaultSwitches
from engine_agent.reconfig.job import Job
from engine_agent.serving import ArmedSwitch


def handoff(job: Job, faults: FaultSwitches, max_downtime_ms: int | None) -> ArmedSwitch | None:
    """The new generation for the serving thread to switch to by itself, or None where the window
    must pause first (a step inside it, a leaver or joiner, a downtime budget, an injected failure)."""
    if not (job.steps.in_old and job.steps.in_new) or job.plan.window or max_downtime_ms is not None:
        return None
    group = job.standby.get("ep")
    if group is None or faults.fail_next_switch_armed():
        return None
    return ArmedSwitch(job.new_generation(group), views=job.views)
