"""One reconfiguration, start to end: the protocol's calls in its order, each with its failure rule.

    background: prepare -> sync -> pause -> switch     (the old generation serves until the pause)
    blocking:   prepare -> pause -> sync -> switch     (prepare's heavy work runs inside the pause)
    background, commit engines (the default): prepare -> sync -> arm
    (the calls and their order are the protocol's `CALLS`; each waits for its end phase, `MOVES`)

`arm` is the engine-agreed commit: the coordinator arms every participant for the new generation
before any engine stops; the engines pause, switch and resume at the first step boundary at which
all members of the old generation are armed, with no coordinator exchange inside the window; the
coordinator observes (one held answer per engine) and records. Its failure rule is where the
engines stand (`OnFailure.by_engines`): none stopped -> roll back, downtime 0 (an engine that never
armed means nobody ever stops; an abort withdraws an arm); some stopped, none switched -> resume all;
some switched -> fail and degrade.

then `finish` (cleaning_up -> succeeded). Each step names the job state it runs in (entered just before
it, under the previous step's rule) and what a failure of it costs (`endings.py`):

- before any pause was sent -> roll back (abort everywhere, joiners released, downtime 0);
- pauses sent, switch not -> resume all on the old generation (the pause's downtime);
- switch sent -> fail and degrade (no way back: record who is on which generation).

Cancel works until commit starts. A cancellable step checks for a cancel while it waits (a launch is
stopped at once); and the move out of the cancellable states (`syncing -> committing`) is refused by
the record while a cancel is pending, so a cancel racing that move is honoured here (the step before's
rule, ending `cancelled`), or it arrives after the move and the API answers 409 `not-cancellable`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.agents.client import AgentClient
from app.agents.fleet import Fleet
from app.backends.base import EXPECTED_FAILURES, JobCancelled, JobFailure, JobMovedOn
from app.backends.reference.confirm import confirm_while_publishing
from app.backends.reference.endings import Endings
from app.backends.reference.fanout import Fanout, ShouldCancel
from app.backends.reference.front_door import drain_leavers, prederive
from app.backends.reference.job import JobRun
from app.backends.reference.launching import Participants
from app.backends.reference.probes import JobProbes, open_job_probes
from app.backends.reference.record import JobRecord, is_member_row
from app.core.runner_settings import RunnerSettings, hang_for_test
from app.jobs.states import JobState
from app.launchers.base import Launcher
from app.probe.settings import ProbeSettings, load_probe_settings
from engine_agent.protocol import (
    COMMITTING,
    MOVES,
    TERMINAL_PHASES,
    CommitMode,
    DowntimeOverrun,
    Operation,
    ReconfigPhase,
    ReconfigStatus,
    Role,
    Strategy,
    Timeouts,
    calls_for,
)

log = logging.getLogger(__name__)


S = JobState


class OnFailure(StrEnum):
    roll_back = "roll_back"  # nothing paused yet: abort everywhere, downtime 0
    resume_all = "resume_all"  # pauses sent: everyone back on the old generation
    fail_and_degrade = "fail_and_degrade"  # switch sent: failed, deployment degraded
    by_engines = "by_engines"  # engine-agreed commit: decided by where the engines stand


@dataclass(frozen=True)
class Step:
    name: Operation
    state: JobState  # the job's state while the step runs
    on_failure: OnFailure
    cancellable: bool = False  # checks for a cancel while it waits


# Each call's rule per strategy: the job's state while it runs, and what its failure costs. Which calls
# a job makes, in which order, is the protocol's (`calls_for`: the engine-agreed commit arms instead of
# pausing and switching).
RULES: Mapping[Strategy, Mapping[Operation, Step]] = {
    Strategy.background: {
        Operation.prepare: Step(Operation.prepare, S.preparing, OnFailure.roll_back, cancellable=True),
        Operation.sync: Step(Operation.sync, S.syncing, OnFailure.roll_back, cancellable=True),
        Operation.pause: Step(Operation.pause, S.committing, OnFailure.resume_all),
        Operation.switch: Step(Operation.switch, S.committing, OnFailure.fail_and_degrade),
        Operation.arm: Step(Operation.arm, S.committing, OnFailure.by_engines),
    },
    Strategy.blocking: {
        Operation.prepare: Step(Operation.prepare, S.preparing, OnFailure.roll_back, cancellable=True),
        # The agents do prepare's work once paused: the pause answers when they are ready.
        Operation.pause: Step(Operation.pause, S.preparing, OnFailure.resume_all),
        Operation.sync: Step(Operation.sync, S.syncing, OnFailure.resume_all),
        Operation.switch: Step(Operation.switch, S.committing, OnFailure.fail_and_degrade),
    },
}


def steps_for(strategy: Strategy, commit_mode: CommitMode) -> tuple[Step, ...]:
    rules = RULES[strategy]
    return tuple(rules[operation] for operation in calls_for(strategy, commit_mode))


def steps_of(run: JobRun) -> tuple[Step, ...]:
    return steps_for(run.strategy, run.commit_mode)


def _switching(status: ReconfigStatus) -> bool:
    """Past the point of no return: switching, switched, or failed inside the switch."""
    if status.phase in COMMITTING:
        return True
    return (
        status.phase == ReconfigPhase.failed
        and status.error is not None
        and status.error.step == Operation.switch.value
    )


class Flow:
    """Runs pending jobs through their strategy's steps."""

    def __init__(
        self,
        record: JobRecord,
        settings: RunnerSettings,
        launchers: Mapping[str, Launcher],
        owner: str,
        probe_settings: ProbeSettings | None = None,
    ) -> None:
        self.record = record
        self.settings = settings
        self.owner = owner
        self.participants = Participants(record, settings, launchers)
        self.endings = Endings(record, settings, launchers)
        self.probe_settings = probe_settings or load_probe_settings()
        self._perform: Mapping[Operation, Callable[[JobRun, Fanout, Step], Awaitable[None]]] = {
            Operation.prepare: self._prepare,
            Operation.sync: self._sync,
            Operation.pause: self._pause,
            Operation.switch: self._switch,
            Operation.arm: self._arm,
        }

    async def run(self, job_id: str, fleet: Fleet) -> None:
        """Drive a pending job (claimed by this coordinator) to a terminal state."""
        run = await self.record.load(job_id)
        if run.state != S.pending:
            return
        if not await self.record.start(run, "claimed by " + self.owner):
            return
        probe = await self._open_probe(run)
        try:
            await self._steps(run, Fanout(fleet, self.settings), probe)
        finally:
            if probe is not None:
                await probe.close()

    async def _steps(self, run: JobRun, fanout: Fanout, probe: JobProbes | None) -> None:
        rule = OnFailure.roll_back
        for step in steps_of(run):
            try:
                if run.state != step.state:
                    await self.record.move(run, step.state)  # into committing: not over a pending cancel
                rule = step.on_failure
                if probe is not None:
                    probe.mark(step.name.value)
                await self._perform[step.name](run, fanout, step)
            except JobMovedOn:
                raise
            except Exception as exc:
                failure = JobFailure.from_exception(run.state.value, exc)
                if not isinstance(exc, EXPECTED_FAILURES):
                    log.exception("job %s: %s failed unexpectedly", run.job_id, step.name.value)
                await self._record_probe(run, probe)
                await self.end(rule, run, fanout, failure)
                return
        await hang_for_test(self.settings, "switched")
        try:
            early = await confirm_while_publishing(self.record, run, fanout.fleet)
        except JobFailure as failure:
            await self._record_probe(run, probe)
            await self.end(OnFailure.fail_and_degrade, run, fanout, failure)
            return
        # The probe's figures once the front door serves the new rank set: its canaries cover it too.
        await self.endings.finish(run, recorded=lambda: self._record_probe(run, probe), early=early)

    async def _open_probe(self, run: JobRun) -> JobProbes | None:
        """Canaries to the engines serving now, and through the front door if any, while the job runs."""
        if not self.probe_settings.enabled:
            return None
        deployment, rows, _ = await self.record.deployment_and_engines(run)
        targets = {row.id: row.url for row in rows if is_member_row(row, deployment)}
        return await open_job_probes(self.record, self.probe_settings, run, targets)

    async def _record_probe(self, run: JobRun, probe: JobProbes | None) -> None:
        """The probe's figures onto the job, before its last transition (never fails the job)."""
        if probe is None:
            return
        stopped = await probe.stop(run)
        if stopped is None:
            return
        changes, summary = stopped
        figures = changes["probe"]
        unreachable = figures.get("unreachable") or {}
        message = (
            f"{summary} ({figures['canaries_sent']} canaries, "
            f"{figures['canaries_failed']} failed, {figures['canaries_late']} late)"
            + (f"; could not reach {', '.join(sorted(unreachable))}" if unreachable else "")
        )
        await self.record.record_probe(run, changes, message)

    async def end(self, rule: OnFailure, run: JobRun, fanout: Fanout, failure: JobFailure) -> None:
        if rule is OnFailure.roll_back:
            await self.endings.roll_back(run, fanout, failure)
        elif rule is OnFailure.resume_all:
            await self.endings.resume_all(run, fanout, failure)
        elif rule is OnFailure.by_engines:
            await self.end(await self._where_engines_stand(run, fanout), run, fanout, failure)
        else:
            await self.endings.fail_and_degrade(run, fanout, failure)

    async def _where_engines_stand(self, run: JobRun, fanout: Fanout) -> OnFailure:
        """After a failed engine-agreed commit: the rule that fits where the engines are. Engines
        inside the window finish it on their own first (switch, or go back)."""
        clients = run.participant_clients()
        await fanout.read_statuses(run, clients)
        if not any(_switching(s) for s in run.statuses.values()) and any(
            s.phase == ReconfigPhase.paused for s in run.statuses.values()
        ):
            await fanout.await_settled(run, clients, TERMINAL_PHASES)  # switch, or go back
        statuses = run.statuses.values()
        if any(_switching(s) for s in statuses):
            return OnFailure.fail_and_degrade
        if any(s.pause is not None for s in statuses):
            return OnFailure.resume_all
        return OnFailure.roll_back

    def _should_cancel(self, run: JobRun, step: Step) -> ShouldCancel | None:
        if not step.cancellable:
            return None
        return lambda: self.record.cancel_requested(run)

    # --- the steps --------------------------------------------------------------------------------

    async def _prepare(self, run: JobRun, fanout: Fanout, step: Step) -> None:
        """Who takes part (launching what is missing), the plan, then `prepare` on every participant."""
        await self.participants.plan(run, fanout.fleet)
        plan = run.plan
        assert plan is not None
        await self.record.note(
            run,
            "plan",
            f"{plan.from_size} -> {plan.to_size}, warm-up {plan.warmup_policy.value} "
            f"({plan.warmup_reason}), transfer {plan.transfer_backend.value}",
            data=plan.summary(),
            changes={
                "warmup_policy": plan.warmup_policy.value,
                "engine_results": run.engine_results(),
                "placement": plan.placement_record(),
                "coverage": plan.coverage or None,
                "reached_dp_size": plan.to_size,
            },
        )
        if await self.record.cancel_requested(run):
            raise JobCancelled(run.state.value)
        await drain_leavers(self.record, run)  # before they stop admitting (at prepare)
        settings = self.settings
        timeouts = Timeouts.model_validate(settings.model_dump(include=set(Timeouts.model_fields)))
        request = plan.prepare_request(run.job_id, timeouts)
        clients = run.participant_clients()
        busy = await fanout.busy_with_other_jobs(run, clients)
        if busy:
            await self.record.note(run, "settle", f"waiting for earlier jobs to finish on {sorted(busy)}")
            await fanout.settle_other_jobs(clients, busy)
        await fanout.drive(
            run,
            clients,
            {MOVES[Operation.prepare].done},
            send=lambda c, wait_s: c.prepare(request, wait_s=wait_s),
            job_phase=run.state.value,
            deadline_s=settings.prepare_deadline_s,
            poll_interval_s=settings.agent_poll_interval_s,
            on_progress=lambda fraction: self.record.progress(run, "preparing", fraction),
            should_cancel=self._should_cancel(run, step),
        )
        await self.record.note(run, "engines", "prepared", changes={"engine_results": run.engine_results()})
        await hang_for_test(settings, "prepared")

    async def _sync(self, run: JobRun, fanout: Fanout, step: Step) -> None:
        await fanout.drive(
            run,
            run.member_clients(),
            {MOVES[Operation.sync].done},
            send=lambda c, wait_s: c.sync(run.job_id, wait_s=wait_s),
            job_phase=run.state.value,
            deadline_s=self.settings.sync_deadline_s,
            poll_interval_s=self.settings.agent_poll_interval_s,
            on_progress=lambda fraction: self.record.progress(run, "syncing", fraction),
            should_cancel=self._should_cancel(run, step),
        )
        await hang_for_test(self.settings, "synced")

    async def _pause(self, run: JobRun, fanout: Fanout, step: Step) -> None:
        """First half of the commit: every participant confirms its pause (one exchange per engine:
        the agent answers once paused, or failed)."""
        settings = self.settings
        await self.record.progress(run, "pausing")
        run.mark("pause_sent")
        await fanout.drive(
            run,
            run.participant_clients(),
            {MOVES[Operation.pause].done},
            send=lambda c, wait_s: c.pause(run.job_id, lease_s=settings.pause_lease_s, wait_s=wait_s),
            job_phase=run.state.value,
            # Blocking: all of prepare's work happens inside this pause.
            deadline_s=settings.prepare_deadline_s
            if run.strategy == Strategy.blocking
            else settings.pause_deadline_s,
            poll_interval_s=settings.commit_poll_interval_s,
            should_cancel=self._should_cancel(run, step),
        )
        run.mark("all_paused")
        self._check_budget(run)
        await hang_for_test(settings, "paused")

    @staticmethod
    def _check_budget(run: JobRun) -> None:
        """The coordinator's commit: before the switch goes out, has any engine been stopped longer
        than the budget? Then every engine goes back (the pause step's rule: resume all)."""
        budget = run.max_downtime_ms
        if budget is None:
            return
        now = time.time()
        stopped = {
            engine_id: ((now - status.pause.paused_at) * 1000.0, status.pause)
            for engine_id, status in run.statuses.items()
            if status.pause is not None and status.role != Role.joining
        }
        if not stopped:
            return
        engine_id, (took, pause) = max(stopped.items(), key=lambda item: item[1][0])
        if took <= budget:
            return
        parts = {
            "step boundary": pause.boundary_wait_ms,
            "warm_up": pause.warmup_ms,
            "capture_graphs": pause.capture_ms,
            "blocking prepare": pause.blocking_prepare_ms,
        }
        part, part_ms = max(parts.items(), key=lambda item: item[1])
        if part_ms < took / 2:
            part = "pause confirmation"  # the engines' own parts were short: the exchange took it
        raise JobFailure(
            run.state.value,
            "downtime-budget-exceeded",
            f"engine {engine_id} was stopped {took:.1f} ms by its {part} before the switch "
            f"(budget {budget} ms)",
            engine_id,
            DowntimeOverrun(engine_id=engine_id, part=part, stopped_ms=round(took, 1), budget_ms=budget),
        )

    async def _arm(self, run: JobRun, fanout: Fanout, step: Step) -> None:
        """The engine-agreed commit: arm every participant; each answers once it committed (one held
        exchange per engine, none of them inside the window)."""
        await self.record.progress(run, "switching")
        prederive(self.record, run)  # the front door's new rank set, ready for the observed commit
        run.mark("arm_sent")
        try:
            await drive_arm(run, fanout, self.settings)
        except JobFailure as failure:
            await self._name_the_overrun(run, fanout, failure)
            raise
        run.mark("all_committed")

    async def _name_the_overrun(self, run: JobRun, fanout: Fanout, failure: JobFailure) -> None:
        """An engine that overran the budget is named by the old members' shared verdict: the job
        reports that member's error, whoever failed first (a joiner only hears "not switching", and
        may say so before the old members' statuses are read)."""
        if failure.error.type != "downtime-budget-exceeded":
            return
        give_up = time.monotonic() + self.settings.abort_deadline_s
        while True:
            for status in run.statuses.values():
                error = status.error
                if error is not None and error.type == failure.error.type and error.engines:
                    named: dict[str, Any] = {"engine_id": error.engines[0], "message": error.message}
                    if error.overrun is not None:
                        named["overrun"] = error.overrun
                    failure.error = failure.error.model_copy(update=named)
                    return
            if time.monotonic() >= give_up:
                return
            await asyncio.sleep(self.settings.agent_poll_interval_s)
            await fanout.read_statuses(run, run.participant_clients())

    async def _switch(self, run: JobRun, fanout: Fanout, step: Step) -> None:
        """Second half of the commit. Nothing but the switch inside the window: it goes out the moment
        the last pause is confirmed, and progress is written once everyone switched."""
        run.mark("switch_sent")
        await fanout.drive(
            run,
            run.participant_clients(),
            {MOVES[Operation.switch].done},
            send=lambda c, wait_s: c.switch(run.job_id, wait_s=wait_s),
            job_phase=run.state.value,
            deadline_s=self.settings.switch_deadline_s,
            poll_interval_s=self.settings.commit_poll_interval_s,
        )
        run.mark("all_committed")


async def drive_arm(run: JobRun, fanout: Fanout, settings: RunnerSettings) -> None:
    """Arm every participant and follow each until it committed. A retried arm changes nothing on an
    engine already armed, so recovery uses this too, to finish a commit a dead coordinator began."""

    def arm(client: AgentClient, wait_s: float = 0.0) -> Awaitable[ReconfigStatus]:
        return client.arm(
            run.job_id,
            deadline_s=settings.arm_deadline_s,
            lease_s=settings.pause_lease_s,
            max_downtime_ms=run.max_downtime_ms,
            wait_s=wait_s,
        )

    if settings.test_hang_at in ("arming", "armed"):  # tests: the coordinator dies, one / every engine armed
        clients = run.participant_clients()
        await fanout.fleet.all(clients[:1] if settings.test_hang_at == "arming" else clients, arm)
        await hang_for_test(settings, settings.test_hang_at)
    await fanout.drive(
        run,
        run.participant_clients(),
        {MOVES[Operation.arm].done},
        send=arm,
        job_phase=run.state.value,
        # The engines' own deadline for arming, then the window (its warm-up and switch).
        deadline_s=settings.arm_deadline_s + settings.switch_deadline_s,
        poll_interval_s=settings.commit_poll_interval_s,
    )
