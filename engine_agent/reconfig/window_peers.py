"""A peer frozen inside the commit window (issue 34).

The window's own steps (the deferred warm-up, graph capture) wait on the new group, with every member
of the old generation stopped. A member frozen there (SIGSTOP, a GC pause, a swap storm) held the others
stopped for the whole collective deadline, and then, once they went back, for a second one: the old
generation they resumed has the frozen member too, so its first step waited on it again. So:

- `watch`: a collective of the window that waits longer than any step could (`CommGroup.slow_after_s`)
  asks the other participants' `/healthz` (`engine_agent.peer_check`, as a stalled serving collective
  does); one that does not answer ends the window at once (the group is given up), and the job knows
  whom (`Job.unresponsive`);
- `refuse_if_given_up`: a member frozen there and thawed within its pause lease would switch on into the group
  the others gave up (its warm-up may complete from what they sent before): the one that gives the
  window up says so on the job's rendezvous store, and the switch asks there first;
- `resume_or_leave`: the way back resumes the old generation only if every other member of it answered;
  otherwise this engine leaves it at once (its group given up: the serving loop reports the generation
  broken, naming who did not answer), so the coordinator fences the frozen member on the survivors'
  evidence and re-forms the group on them, instead of the survivors stepping into it and waiting again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from engine_agent.groups import SLOW_AFTER_S, CommGroup
from engine_agent.peer_check import BrokenGroup, check_peers
from engine_agent.reconfig.errors import ReconfigError
from engine_agent.reconfig.job import Job
from engine_agent.serving import ServingEngine

log = logging.getLogger(__name__)

# A window collective waits this long before the peers are asked: no step waits on a live peer's answer
# to `/healthz` (1 s at most), so asking early costs nothing and ends a frozen peer's window sooner.
WINDOW_SLOW_AFTER_S = 0.5
GIVEN_UP_KEY = "commit/given_up"  # on the job's rendezvous store: a participant gave the window up


def watch(job: Job, group: CommGroup, on_found: Callable[[int, list[str]], None]) -> None:
    """Probe the other participants once a collective on `group` runs slow; give the group up when one
    does not answer. `on_found(old generation, names)`: the agent's report of who stalled."""
    request = job.request
    seen: dict[str, str] = {}
    for member in [*request.old_members, *request.members]:
        if member.engine_id != job.me:
            seen.setdefault(member.engine_id, member.url)
    others = list(seen.items())

    def found(broken: BrokenGroup) -> None:
        if not broken.unresponsive or group.on_slow is not slow:
            return  # all answered, or the window is over (its step finished meanwhile)
        job.unresponsive = list(broken.unresponsive)
        stalled_old = [e for e in broken.unresponsive if e in job.old_ids]
        if stalled_old:
            on_found(request.old_generation, stalled_old)
        names = ", ".join(broken.unresponsive)
        log.warning("job %s: %s did not answer inside the commit window; giving it up", request.job_id, names)
        group.abandon(f"no answer from {names} inside the commit window")
        try:  # a frozen member thawed within its lease must not switch on into the group given up
            assert job.store is not None
            job.store.set(GIVEN_UP_KEY, f"{job.me}: no answer from {names}")
        except Exception:
            log.warning("job %s: telling the others the window was given up failed", request.job_id)

    def slow() -> None:
        check_peers(request.generation, others, found)

    group.on_slow = slow
    group.slow_after_s = WINDOW_SLOW_AFTER_S


def unwatch(group: CommGroup) -> None:
    """The window's steps are over: the group (serving next, or destroyed) is no longer watched."""
    group.on_slow = None
    group.slow_after_s = SLOW_AFTER_S


@contextlib.contextmanager
def watching(job: Job, on_found: Callable[[int, list[str]], None]) -> Iterator[None]:
    """`watch` the job's new group (if it has one) while the window's steps run, `unwatch` after."""
    group = job.standby.get("ep")
    if group is not None:
        watch(job, group, on_found)
    try:
        yield
    finally:
        if group is not None:
            unwatch(group)


def given_up(job: Job) -> str | None:
    """Before the switch: why a peer gave this window up, if one did (None: switch). Asked only of a
    window that lasted longer than a peer waits before asking (a normal one is not slowed by it)."""
    if job.store is None or time.monotonic() - job.paused_monotonic < WINDOW_SLOW_AFTER_S:
        return None
    try:
        if not job.store.check([GIVEN_UP_KEY]):
            return None
        return f"the commit window was given up ({job.store.get(GIVEN_UP_KEY).decode()}); not switching"
    except Exception:  # the store's host is gone: its engine gave the window up, or it is dead
        return "the job's rendezvous store does not answer; not switching"


def refuse_if_given_up(job: Job, roll_back: Callable[[Job], None]) -> None:
    """Before the switch: a peer gave the window up, so go back (`roll_back`) and fail the job here."""
    reason = given_up(job)
    if reason is not None:
        roll_back(job)
        raise ReconfigError("window-given-up", reason)


def resume_or_leave(job: Job, engine: ServingEngine) -> None:
    """Serve the old generation again (the engine is paused on it), unless a member of it did not
    answer inside the window: then leave it at once, broken."""
    stalled = [e for e in job.unresponsive if e in job.old_ids and e != job.me]
    if stalled:
        generation = job.request.old_generation
        log.warning("job %s: not resuming generation %s: %s did not answer", job.request.job_id, generation,
                    ", ".join(stalled))  # fmt: skip
        engine.abandon(generation, f"{', '.join(stalled)} did not answer inside the commit window")
    engine.resume()  # with the group given up, the loop's first collective leaves it and reports it
