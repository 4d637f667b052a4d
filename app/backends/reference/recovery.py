"""Crash recovery: finish or roll back a job whose coordinator died, from what the agents report.

A coordinator claims every non-terminal job whose lease expired (or that it held before a restart) and
asks every participant for `GET /v1/reconfig` and `GET /v1/info`:

- no engine paused or switched for the job -> abort all -> `rolled_back`;
- every engine switched -> finish (`cleaning_up` -> `succeeded`), the deployment on the new generation;
- some paused, none switched -> resume all -> `rolled_back` (with the downtime the pause cost);
- some switched, some not -> engines still paused for the job are sent `switch` (their part of the
  commit); if they all complete, finish; otherwise `failed`, deployment `degraded`;
- an engine-agreed commit the coordinator had begun (job `committing`) with some engines armed and the
  rest synced -> arm the rest, so the engines finish the commit (armed ones would otherwise wait out
  their arm deadline and roll back).

No job stays non-terminal and no engine stays paused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from app.agents.errors import AgentCallError
from app.agents.fleet import Fleet
from app.backends.base import JobFailure
from app.backends.reference.endings import Endings
from app.backends.reference.fanout import Fanout
from app.backends.reference.flow import drive_arm
from app.backends.reference.job import JobRun
from app.backends.reference.planner import Plan
from app.backends.reference.record import JobRecord
from app.core.runner_settings import RunnerSettings
from app.jobs.models import ReconfigurationJob
from app.jobs.states import TERMINAL_STATES, JobState
from app.launchers.base import Launcher
from engine_agent.protocol import (
    ENGINES_FINISHING,
    MOVES,
    STOPPED,
    TERMINAL_PHASES,
    AgentInfo,
    CommitMode,
    LeavePolicy,
    Member,
    Operation,
    ReconfigStatus,
    StoreAddress,
    Strategy,
    TransferBackend,
    WarmupPolicy,
)

log = logging.getLogger(__name__)

S = JobState
# Where an engine-agreed commit can go on: synced, or further along it (the protocol's phases).
ARMABLE_PHASES = ENGINES_FINISHING | {MOVES[Operation.sync].done, MOVES[Operation.arm].done}


def plan_from_job(job: ReconfigurationJob) -> Plan | None:
    """The participants of a job as its `engine_results` recorded them when it was planned."""
    results = [r for r in (job.engine_results or []) if isinstance(r, dict) and r.get("engine_id")]
    if not results:
        return None

    def member(r: dict[str, Any]) -> Member:
        return Member(engine_id=str(r["engine_id"]), url=str(r["url"]))

    old = sorted((r for r in results if r.get("old_rank") is not None), key=lambda r: int(r["old_rank"]))
    new = sorted((r for r in results if r.get("new_rank") is not None), key=lambda r: int(r["new_rank"]))
    return Plan(
        deployment="",
        old_generation=job.from_generation,
        generation=job.to_generation,
        old_members=[member(r) for r in old],
        members=[member(r) for r in new],
        joiners=[str(r["engine_id"]) for r in results if r.get("role") == "joining"],
        leavers=[str(r["engine_id"]) for r in results if r.get("role") == "leaving"],
        old_placement=[],
        placement=[],
        store=StoreAddress(host="127.0.0.1", port=1),
        warmup_policy=WarmupPolicy(job.warmup_policy or "eager"),
        warmup_reason="recovered",
        transfer_backend=TransferBackend.gloo,
        strategy=Strategy(job.strategy),
        leave_policy=LeavePolicy.finish,
    )


def _switched(plan: Plan, engine_id: str, status: ReconfigStatus | None, info: AgentInfo | None) -> bool:
    if status is not None and status.phase == MOVES[Operation.switch].done:
        return True
    if info is None:
        return False
    if engine_id in plan.leavers:
        return info.generation >= plan.generation or (
            status is not None and status.phase == MOVES[Operation.switch].done
        )
    return info.generation == plan.generation and info.rank is not None


class Recovery:
    """Ends the jobs a dead coordinator left (claimed through their expired leases)."""

    def __init__(
        self, record: JobRecord, settings: RunnerSettings, launchers: Mapping[str, Launcher]
    ) -> None:
        self.record = record
        self.settings = settings
        self.endings = Endings(record, settings, launchers)

    async def reconcile(self, job_id: str, fleet: Fleet) -> None:
        run = await self.record.load(job_id)
        if run.state == S.pending or run.state in TERMINAL_STATES:
            return
        plan = plan_from_job(await self.record.job(job_id))
        phase = run.state.value
        restarted = JobFailure(
            phase,
            "coordinator-restarted",
            f"the coordinator stopped while the job was {phase}; reconciled from the agents",
        )
        await self.record.note(run, "recovery", f"reconciling after a coordinator restart (job was {phase})")
        if plan is None:
            # Nothing was sent to any agent yet.
            await self.record.move(
                run,
                S.rolled_back,
                message=restarted.error.message,
                changes={"error": restarted.error, "downtime_ms": 0.0},
            )
            return
        run.plan = plan
        run.clients = {
            m.engine_id: fleet.client(m.engine_id, m.url, run.agent_keys) for m in plan.participants
        }
        fanout = Fanout(fleet, self.settings)
        if run.commit_mode == CommitMode.engines:
            await fanout.read_statuses(run, run.participant_clients())
            if run.state == S.committing and self._arming_cut_short(run):
                # The dead coordinator had begun the commit: arm the rest, and the engines finish it
                # (armed ones would otherwise wait out their arm deadline, then roll back).
                await self.record.note(run, "recovery", "arming the engines the stopped coordinator had not")
                try:
                    await drive_arm(run, fanout, self.settings)
                except JobFailure as failure:
                    log.warning("job %s: arming after the restart failed: %s", run.job_id, failure)
            # Armed engines commit (or withdraw) on their own: let them finish before judging.
            if any(s.phase in ENGINES_FINISHING for s in run.statuses.values()):
                await self.record.note(run, "recovery", "waiting for the armed engines to finish the commit")
                await fanout.await_settled(run, run.participant_clients(), TERMINAL_PHASES)
        switched, paused = await self._survey(run, fleet)
        clients = run.participant_clients()
        if run.state == S.cleaning_up or (switched and len(switched) == len(clients)):
            await self.endings.finish(run)
        elif switched:
            await self._complete_commit(run, fanout, switched, restarted)
        elif paused:
            await self.endings.resume_all(run, fanout, restarted)
        else:
            # Nobody stopped serving: abort everywhere.
            await fanout.abort_all(run, clients, {MOVES[Operation.abort].done})
            await self.endings.release_joiners(run)
            await self.record.move(
                run,
                S.rolled_back,
                message=restarted.error.message,
                changes={
                    "error": restarted.error,
                    "downtime_ms": run.downtime(now=time.time()).downtime_ms,
                    "engine_results": run.engine_results(ended_on="old"),
                },
            )

    @staticmethod
    def _arming_cut_short(run: JobRun) -> bool:
        """Every participant synced or further along the engine-agreed commit, and not all of them
        armed yet: the commit can go on where the coordinator stopped."""
        phases = [
            status.phase if (status := run.statuses.get(client.engine_id)) is not None else None
            for client in run.participant_clients()
        ]
        return MOVES[Operation.sync].done in phases and all(phase in ARMABLE_PHASES for phase in phases)

    async def _survey(self, run: JobRun, fleet: Fleet) -> tuple[set[str], set[str]]:
        """Ask every participant where it stands: (engines switched, engines paused for the job)."""
        assert run.plan is not None
        clients = run.participant_clients()
        reconfigs = await fleet.each(clients, lambda c: c.reconfig())
        infos_raw = await fleet.each(clients, lambda c: c.info())
        statuses: dict[str, ReconfigStatus | None] = {}
        infos: dict[str, AgentInfo | None] = {}
        for client in clients:
            eid = client.engine_id
            status = reconfigs[eid]
            found = status if isinstance(status, ReconfigStatus) and status.job_id == run.job_id else None
            info = infos_raw[eid]
            statuses[eid] = found
            infos[eid] = info if isinstance(info, AgentInfo) else None
            if found is not None:
                run.statuses[eid] = found
            if isinstance(info, AgentInfo):
                run.infos[eid] = info
        switched = {eid for eid in statuses if _switched(run.plan, eid, statuses[eid], infos[eid])}
        paused = {eid for eid, s in statuses.items() if s is not None and s.phase in STOPPED}
        unreachable = {eid for eid, i in infos.items() if i is None}
        log.warning(
            "job %s (%s): switched=%s paused=%s unreachable=%s",
            run.job_id,
            run.state.value,
            switched,
            paused,
            unreachable,
        )
        return switched, paused

    async def _complete_commit(
        self, run: JobRun, fanout: Fanout, switched: set[str], restarted: JobFailure
    ) -> None:
        """Mixed: complete the commit on the engines still paused for this job, if they all can;
        otherwise resume whoever is still paused and fail (degraded)."""
        rest = [c for c in run.participant_clients() if c.engine_id not in switched]
        results = await fanout.fleet.each(rest, lambda c: c.switch(run.job_id))
        if not any(isinstance(r, AgentCallError) for r in results.values()):
            try:
                await fanout.drive(
                    run,
                    rest,
                    {MOVES[Operation.switch].done},
                    job_phase="committing",
                    deadline_s=self.settings.switch_deadline_s,
                    poll_interval_s=self.settings.commit_poll_interval_s,
                )
            except JobFailure as failure:
                await self._fail_mixed(run, fanout, failure)
                return
            await self.endings.finish(run)
            return
        partial = JobFailure(
            str(restarted.error.phase),
            "partial-switch",
            f"{restarted.error.message}: {sorted(switched)} switched, the others could not",
        )
        await self._fail_mixed(run, fanout, partial)

    async def _fail_mixed(self, run: JobRun, fanout: Fanout, failure: JobFailure) -> None:
        """No engine stays paused: resume whoever is still paused, then fail (degraded)."""
        paused = [
            c
            for c in run.participant_clients()
            if (s := run.statuses.get(c.engine_id)) is not None and s.phase in STOPPED
        ]
        if paused:
            await fanout.fleet.each(paused, lambda c: c.abort(run.job_id))
        if run.state != S.committing:
            # Only a committing job can fail part-way; a job recorded earlier moves through the log as failed.
            await self.record.move(
                run, S.failed, message=failure.error.message, changes={"error": failure.error}
            )
            return
        await self.endings.fail_and_degrade(run, fanout, failure)
