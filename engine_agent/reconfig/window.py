"""The commit window: pause, switch, resume, the way back to the old generation, and the pause leases.

A member of the old generation stops at the agreed step boundary; whatever the table puts inside the
window runs (deferred warm-up and graph capture; for the blocking strategy, all of prepare's work);
then a pause lease starts: no switch or resume within it and the engine serves its old generation
again by itself. The same holds when a peer's pause stopped this engine before its own pause request
came (the peer lease): an engine never stays stopped forever.

The engine-agreed commit (`arm`) runs the same window from the boundary the serving loops agreed on
(every member armed), in the one worker thread, with no coordinator exchange inside it."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import torch

from engine_agent.protocol import (
    TERMINAL_PHASES,
    AgentError,
    AgentState,
    DowntimeOverrun,
    PauseInterval,
    ReconfigPhase,
)
from engine_agent.reconfig.boundary import handoff as armed_handoff
from engine_agent.reconfig.cleanup import Releasable, RetiredGeneration
from engine_agent.reconfig.errors import Aborted, ReconfigError
from engine_agent.reconfig.faults import FaultSwitches
from engine_agent.reconfig.job import Job, Site
from engine_agent.reconfig.prepare import Builder
from engine_agent.reconfig.steps import Step
from engine_agent.reconfig.window_peers import refuse_if_given_up, resume_or_leave, watching
from engine_agent.serving import ActiveGeneration, ArmedSwitch, PausedAt

log = logging.getLogger(__name__)

VERDICT_KEY = "commit/verdict"  # on the store: "go" or "back" (downtime budget), for the joiners
BOUNDARY_KEY = "commit/boundary"  # on the job's rendezvous store: the old generation took its boundary
BOUNDARY_POLL_S = 0.2  # a joiner's wait for it, in slices of this (an abort is seen within one)


class CommitWindow:
    def __init__(
        self, site: Site, builder: Builder, faults: FaultSwitches, default_pause_lease_s: float
    ) -> None:
        self.site = site
        self.builder = builder
        self.faults = faults
        self.default_pause_lease_s = default_pause_lease_s
        self._peer_pause_lease: threading.Timer | None = None

    # ---- the window's operations (each runs in the job's worker thread) ----------------------------

    def pause(self, job: Job, lease_s: float | None) -> None:
        """Stop at the boundary (already taken by an armed engine) and run the window's steps; then
        the pause lease starts (`lease_s` None: the caller holds one already)."""
        site, request = self.site, job.request
        self._stop_admitting(job)
        if job.steps.in_old:
            paused = site.engine.pause(request.timeouts.collective_s)
            self.cancel_peer_lease()
            interval = PauseInterval(paused_at=paused.wall, boundary_wait_ms=paused.boundary_wait_ms)
            job.paused_monotonic = paused.monotonic
        else:  # a joiner served nothing: it is never down, so it reports no pause interval
            interval = PauseInterval(paused_at=time.time())
            job.paused_monotonic = time.monotonic()
        job.paused = True
        reported = interval if job.steps.in_old else None
        site.board.update(job, pause=reported)
        if job.plan.window:
            site.board.count_steps(job, job.plan.window)
            with watching(job, site.hooks.on_unresponsive):  # a frozen peer ends it, not the deadline
                took = self.builder.run(job, job.plan.window)
            interval.warmup_ms = took.pop(Step.warm_up, 0.0)
            interval.capture_ms = took.pop(Step.capture_graphs, 0.0)
            interval.blocking_prepare_ms = sum(took.values())
        with site.board.lock:
            if job.abort.is_set():
                raise Aborted()
            # The lease first: starting its timer thread can take a while on a busy host, and the
            # long-polls woken by `paused` need this lock to answer (this is inside the window).
            if lease_s is not None:
                self.start_lease(job, lease_s)
            site.board.update(job, phase=ReconfigPhase.paused, step=None, pause=reported)

    def switch(self, job: Job) -> None:
        site, request = self.site, job.request
        if job.lease_deadline is not None and time.monotonic() > job.lease_deadline:
            # The fence: past the lease the coordinator may have abandoned this generation (it gives up
            # on a commit only after its switch deadline, longer than the lease). An agent frozen past
            # it, thawed with the switch still queued, must serve the old generation, never the new.
            self.roll_back(job)
            raise ReconfigError(
                "pause-lease-expired",
                f"switch to generation {request.generation} came after the pause lease ran out; refused, "
                f"serving generation {request.old_generation}",
            )
        refuse_if_given_up(job, self.roll_back)  # a peer gave this window up: no switch into it
        if self.faults.take_fail_next_switch():
            raise ReconfigError("injected-failure", "switch failed (fault injection)")
        started = time.monotonic()
        retired: ActiveGeneration | None
        if job.steps.in_new:
            standby = job.standby.take_all()
            new = job.new_generation(standby["ep"])
            retired = site.engine.switch(new, views=job.views)
            job.staged, job.stacks, job.views, job.graphs = {}, {}, None, None
            site.resident.drop()  # a broken generation's rows: the new one serves from its copies
        else:
            retired = site.engine.leave(fail_queued=False)  # a leaver drained its queue before the pause
        switch_ms = (time.monotonic() - started) * 1000.0
        if retired is not None:  # its groups and graphs go in the background, never in the window
            graphs: list[Releasable] = [retired.graphs] if retired.graphs is not None else []
            site.cleanup.submit(
                RetiredGeneration(request.job_id, retired.generation, [retired.group], graphs)
            )
        resume_started = time.monotonic()
        if job.steps.in_new and not site.engine.wait_serving(request.timeouts.collective_s):
            log.warning(
                "job %s: generation %s not serving within the collective deadline",
                request.job_id,
                request.generation,
            )
        self.finish_window(job, switch_ms=switch_ms, resume_started=resume_started)
        site.board.update(job, phase=ReconfigPhase.committed, step=None)

    # ---- the engine-agreed commit ------------------------------------------------------------------

    def _stop_admitting(self, job: Job) -> None:
        """A leaver stops admitting only at the commit (its pause, or its arm): it served through
        prepare and sync; the step loop holds the boundary until the requests it holds are served,
        the others serving meanwhile."""
        if job.steps.drains:
            self.site.engine.set_admitting(False)
            self.site.engine.set_drain_before_pause(True)

    def arm(self, job: Job, deadline_s: float, lease_s: float, max_downtime_ms: int | None = None) -> None:
        """Arm, wait for the boundary every member of the old generation is armed for, then pause,
        switch and resume there, with nothing asked of the coordinator (`protocol.ArmRequest`).

        The pause lease is started here, before the boundary, so no timer thread starts inside the
        window; it runs out no sooner than a full lease after the latest possible boundary."""
        site, request = self.site, job.request
        self.start_lease(job, deadline_s + lease_s)
        self._stop_admitting(job)  # a leaver: only now, and the agreed boundary waits for its queue
        handoff = armed_handoff(job, self.faults, max_downtime_ms)
        try:
            if job.steps.in_old:
                self._arm_engine(job, deadline_s, handoff)
            elif job.old_ids:
                self._await_boundary(job, deadline_s)
            else:  # formation: no old generation to stop, the new one starts at once
                with site.board.lock:
                    job.at_boundary = True
        except BaseException:
            self.cancel_lease(job)
            raise
        if handoff is not None and handoff.paused is not None:
            self._after_armed_switch(job, handoff)
            return
        self.pause(job, lease_s=None)
        if max_downtime_ms is not None and job.old_ids:
            self._budget_verdict(job, max_downtime_ms)
        with site.board.lock:
            if job.lease_expired:
                raise Aborted()  # the lease resumed the old generation and wrote the outcome
            self.cancel_lease(job)
            site.board.update(job, phase=ReconfigPhase.switching, step="switch")
        self.switch(job)
        log.info(
            "job %s: switched to generation %s at the agreed boundary", request.job_id, request.generation
        )

    def _arm_engine(self, job: Job, deadline_s: float, handoff: ArmedSwitch | None = None) -> None:
        site, request = self.site, job.request
        engine = site.engine
        if self.faults.take_hold_arm():
            log.warning("job %s: holding the arm (fault injection)", request.job_id)
            job.abort.wait(deadline_s)  # a stalled engine: it never arms, its peers wait in vain
            paused = None
        else:
            engine.arm(request.generation, handoff)
            job.commit_armed = True
            paused = engine.wait_armed_boundary(deadline_s, withdraw_s=request.timeouts.collective_s)
        if paused is None:
            if job.abort.is_set():
                raise Aborted()
            raise ReconfigError(
                "arm-timeout",
                f"not every member of generation {request.old_generation} armed for generation "
                f"{request.generation} within {deadline_s:g} s; nothing paused",
            )
        with site.board.lock:
            # The boundary wins over an abort that raced it: every member stopped here and switches.
            job.at_boundary = True
            job.abort.clear()
        if job.me == job.old_ids[0]:
            self._announce_boundary(job)

    def _announce_boundary(self, job: Job) -> None:
        """Tell the joiners (they are not in the old group) that the boundary came: one key on the
        job's rendezvous store, set by the old rank 0."""
        try:
            assert job.store is not None
            job.store.set(BOUNDARY_KEY, "1")
        except Exception:  # the joiners then time out and the new group's first step fails: degraded
            log.exception("job %s: announcing the boundary to the joiners failed", job.request.job_id)

    def _await_boundary(self, job: Job, deadline_s: float) -> None:
        """A joiner: wait for the old members' boundary (in slices, so an abort is seen at once)."""
        store = job.store
        assert store is not None
        give_up = time.monotonic() + deadline_s
        while True:
            if job.abort.is_set():
                raise Aborted()
            left = give_up - time.monotonic()
            if left <= 0:
                raise ReconfigError(
                    "arm-timeout",
                    f"generation {job.request.old_generation} did not reach its commit boundary within "
                    f"{deadline_s:g} s",
                )
            try:
                store.wait([BOUNDARY_KEY], timedelta(seconds=min(left, BOUNDARY_POLL_S)))
                break
            except Exception:  # the slice ran out (the store raises on a wait timeout)
                if store.check([BOUNDARY_KEY]):
                    break
        with self.site.board.lock:
            job.at_boundary = True

    def _budget_verdict(self, job: Job, budget_ms: int) -> None:
        """Before the switch: has any old member been stopped longer than the budget? The old members
        agree over their old group (idle while they are paused: one small all-reduce of everyone's
        stopped time and warm-up time), so all of them decide the same; the old rank 0 tells the
        joiners through the store. Over budget: `ReconfigError`, and the worker's failure path puts
        every one of them back on the old generation."""
        request = job.request
        if job.steps.in_old:
            active = self.site.engine.active
            assert active is not None and job.status.pause is not None
            group, rank = active.group, active.rank
            figures = torch.zeros(3 * group.size, dtype=torch.float64, device=group.device)
            figures[3 * rank] = (time.monotonic() - job.paused_monotonic) * 1000.0
            figures[3 * rank + 1] = job.status.pause.warmup_ms
            figures[3 * rank + 2] = job.status.pause.capture_ms
            stopped = group.allreduce(figures).tolist()
            over = [
                (stopped[3 * r], stopped[3 * r + 1], stopped[3 * r + 2], r)
                for r in range(group.size)
                if stopped[3 * r] > budget_ms
            ]
            if (
                job.me == job.old_ids[0]
                and job.store is not None
                and len(job.participants) > len(job.old_ids)
            ):
                job.store.set(VERDICT_KEY, "back" if over else "go")
            if not over:
                return
            took, warmup, capture, worst = max(over)
            part = "window"
            if max(warmup, capture) >= took / 2:
                part = "warm_up" if warmup >= capture else "capture_graphs"
            raise ReconfigError(
                "downtime-budget-exceeded",
                f"engine {job.old_ids[worst]} was stopped {took:.1f} ms in its {part} "
                f"(budget {budget_ms} ms); every engine resumed generation {request.old_generation}",
                engines=[job.old_ids[worst]],
                overrun=DowntimeOverrun(
                    engine_id=job.old_ids[worst], part=part, stopped_ms=round(took, 1), budget_ms=budget_ms
                ),
            )
        store = job.store
        assert store is not None
        store.wait([VERDICT_KEY], timedelta(seconds=request.timeouts.collective_s))
        if store.get(VERDICT_KEY) == b"back":
            raise ReconfigError(
                "downtime-budget-exceeded",
                f"the old generation overran the {budget_ms} ms downtime budget; not switching",
            )

    def resume(self, job: Job) -> None:
        self.roll_back(job)
        self.site.board.update(job, phase=ReconfigPhase.resumed, step=None)

    # ---- the way back ------------------------------------------------------------------------------

    def roll_back(self, job: Job) -> None:
        """Back to the old generation, closing the stopped window if there was one (never raises)."""
        resume_started = time.monotonic()
        was_paused = job.paused
        self.back_to_old_generation(job)
        if was_paused:
            self.finish_window(job, switch_ms=0.0, resume_started=resume_started)

    def back_to_old_generation(self, job: Job) -> None:
        """Drop everything staged and serve the old generation (never raises)."""
        engine = self.site.engine
        if job.channel is not None:
            try:
                job.channel.close()
            except Exception:
                log.warning("closing the weight channel failed", exc_info=True)
            job.channel = None
        for error in job.standby.destroy_all():
            log.warning("destroying a standby group failed: %s", error)
        if job.graphs is not None:  # graphs of a generation that never served: the cleanup releases them
            self.site.cleanup.submit(
                RetiredGeneration(job.request.job_id, job.request.generation, [], [job.graphs])
            )
        job.staged, job.stacks, job.views, job.graphs = {}, {}, None, None
        if job.steps.in_old:
            engine.set_drain_before_pause(False)
            engine.set_admitting(True)
            # Paused by this job or by a peer's pause for it: either way the old generation serves
            # again, or the members that resumed would wait on this one in their next step.
            self.cancel_peer_lease()
            if engine.state == AgentState.paused:
                resume_or_leave(job, engine)  # not onto a generation whose member froze
        job.paused = False

    def _after_armed_switch(self, job: Job, switched: ArmedSwitch) -> None:
        """The serving thread switched at the boundary: what `pause` and `switch` record, after it."""
        site, request = self.site, job.request
        paused, retired = switched.paused, switched.retired
        assert paused is not None
        job.standby.take_all()  # the engine serves from the group now: no roll-back may destroy it
        job.staged, job.stacks, job.views, job.graphs = {}, {}, None, None
        site.resident.drop()
        job.paused_monotonic = paused.monotonic
        job.paused = True
        with site.board.lock:
            self.cancel_lease(job)
            interval = PauseInterval(paused_at=paused.wall, boundary_wait_ms=0.0)
            site.board.update(job, phase=ReconfigPhase.switching, step="switch", pause=interval)
        if retired is not None:  # its groups and graphs go in the background, as after `switch`
            graphs: list[Releasable] = [retired.graphs] if retired.graphs is not None else []
            site.cleanup.submit(
                RetiredGeneration(request.job_id, retired.generation, [retired.group], graphs)
            )
        if not site.engine.wait_serving(request.timeouts.collective_s):
            log.warning("job %s: generation %s not serving in time", request.job_id, request.generation)
        switch_ms = (switched.switched_monotonic - paused.monotonic) * 1000.0
        self.finish_window(job, switch_ms=switch_ms, resume_started=switched.switched_monotonic)
        site.board.update(job, phase=ReconfigPhase.committed, step=None)
        log.info(
            "job %s: switched to generation %s at the agreed boundary (serving thread)",
            request.job_id,
            request.generation,
        )

    def finish_window(self, job: Job, *, switch_ms: float, resume_started: float) -> None:
        interval = job.status.pause
        if interval is None:
            return
        now = time.monotonic()
        if job.steps.in_new:  # the window ends at the new generation's first step, stamped by the engine
            now = min(now, max(self.site.engine.serving_since() or now, resume_started))
        interval.switch_ms = switch_ms
        interval.resume_ms = (now - resume_started) * 1000.0
        interval.pause_ms = (now - job.paused_monotonic) * 1000.0
        interval.resumed_at = interval.paused_at + interval.pause_ms / 1000.0
        if job.steps.in_old:
            self.site.hooks.on_pause(interval.pause_ms)
        self.site.board.update(job, pause=interval)

    # ---- leases ------------------------------------------------------------------------------------

    def start_lease(self, job: Job, lease_s: float) -> None:
        job.lease_deadline = time.monotonic() + lease_s
        timer = threading.Timer(lease_s, self._lease_expired, args=(job,))
        timer.daemon = True
        job.lease = timer
        timer.start()

    def cancel_lease(self, job: Job) -> None:
        if job.lease is not None:
            job.lease.cancel()
            job.lease = None
        self.cancel_peer_lease()

    def cancel_peer_lease(self) -> None:
        with self.site.board.lock:
            if self._peer_pause_lease is not None:
                self._peer_pause_lease.cancel()
                self._peer_pause_lease = None

    def on_engine_paused(self, paused: PausedAt) -> None:
        """The serving loop stopped at a boundary. When a peer's pause stopped us before our own pause
        request came, the pause lease starts now all the same: we never stay stopped forever."""
        if not paused.by_peer:
            return
        with self.site.board.lock:
            job = self.site.board.job
            lease_s = job.request.timeouts.pause_lease_s if job else self.default_pause_lease_s
            if self._peer_pause_lease is not None:
                self._peer_pause_lease.cancel()
            timer = threading.Timer(lease_s, self._peer_pause_expired, args=(job,))
            timer.daemon = True
            self._peer_pause_lease = timer
            timer.start()

    def _lease_expired(self, job: Job) -> None:
        board = self.site.board
        with board.lock:
            if board.job is not job or not job.paused or job.lease is None:
                return
            job.lease = None
            job.lease_expired = True
            lease_error = AgentError(
                type="pause-lease-expired",
                message="no switch or resume within the pause lease; resumed generation "
                f"{job.request.old_generation}",
                step="pause",
            )
        log.warning("job %s: pause lease expired, resuming the old generation", job.request.job_id)
        self.roll_back(job)
        board.update(job, phase=ReconfigPhase.failed, step=None, error=lease_error)

    def _peer_pause_expired(self, job: Job | None) -> None:
        """Stopped by a peer, and no pause/switch/resume of our own followed within the lease."""
        engine, board = self.site.engine, self.site.board
        with board.lock:
            self._peer_pause_lease = None
            if engine.state != AgentState.paused or (job is not None and job.paused):
                return
        log.warning("stopped by a peer's pause and heard nothing within the lease: resuming")
        if job is not None and job.status.phase not in TERMINAL_PHASES:
            job.lease_expired = True
            board.update(
                job,
                phase=ReconfigPhase.failed,
                error=AgentError(
                    type="pause-lease-expired", message="stopped by a peer's pause; lease ran out"
                ),
            )
            job.abort.set()  # after the outcome is written: a step still running must not overwrite it
            self.back_to_old_generation(job)
        engine.resume()
