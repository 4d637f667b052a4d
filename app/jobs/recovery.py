"""Crash recovery: finish or roll back a job whose coordinator died, from what the agents report.

A coordinator claims every non-terminal job whose lease expired (or that it held before a restart) and
asks every participant for `GET /v1/reconfig` and `GET /v1/info`:

- no engine paused or switched for the job -> abort all -> `rolled_back`;
- every engine switched -> finish (`cleaning_up` -> `succeeded`), the deployment on the new generation;
- some paused, none switched -> resume all -> `rolled_back` (with the downtime the pause cost);
- some switched, some not -> engines still paused for the job are sent `switch` (their part of the
  commit); if they all complete, finish; otherwise `failed`, deployment `degraded`.

No job stays non-terminal and no engine stays paused.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from app.agents.client import AgentCallError
from app.jobs.models import ReconfigurationJob
from app.jobs.planner import Plan
from app.jobs.states import JobState
from engine_agent.protocol import (
    AgentInfo,
    LeavePolicy,
    Member,
    ReconfigPhase,
    ReconfigStatus,
    StoreAddress,
    Strategy,
    TransferBackend,
    WarmupPolicy,
)

if TYPE_CHECKING:
    from app.jobs.runner import JobRun, JobRunner

log = logging.getLogger(__name__)

S = JobState
PAUSED_PHASES = frozenset({ReconfigPhase.pausing, ReconfigPhase.paused, ReconfigPhase.switching})


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
    if status is not None and status.phase == ReconfigPhase.committed:
        return True
    if info is None:
        return False
    if engine_id in plan.leavers:
        return info.generation >= plan.generation or (
            status is not None and status.phase == ReconfigPhase.committed
        )
    return info.generation == plan.generation and info.rank is not None


async def reconcile_job(runner: JobRunner, job_id: str) -> None:
    run = await runner.load_run(job_id)
    if run.state in (S.pending, S.succeeded, S.rolled_back, S.failed, S.cancelled):
        return
    job: ReconfigurationJob | None = await runner._db(lambda s: s.get(ReconfigurationJob, job_id))
    assert job is not None
    plan = plan_from_job(job)
    phase = run.state.value
    restarted = {
        "phase": phase,
        "engine_id": None,
        "type": "coordinator_restarted",
        "message": f"the coordinator stopped while the job was {phase}; reconciled from the agents",
    }
    await runner.note(run, "recovery", f"reconciling after a coordinator restart (job was {phase})")
    if plan is None:
        # Nothing was sent to any agent yet.
        await runner.move(
            run, S.rolled_back, message=restarted["message"], changes={"error": restarted, "downtime_ms": 0.0}
        )
        return
    run.plan = plan
    async with runner.fleet() as fleet:
        run.clients = {m.engine_id: fleet.client(m.engine_id, m.url) for m in plan.participants}
        clients = run.participant_clients()
        reconfigs = await fleet.each(clients, lambda c: c.reconfig())
        infos_raw = await fleet.each(clients, lambda c: c.info())
        statuses: dict[str, ReconfigStatus | None] = {}
        infos: dict[str, AgentInfo | None] = {}
        for client in clients:
            eid = client.engine_id
            status = reconfigs[eid]
            statuses[eid] = status if isinstance(status, ReconfigStatus) and status.job_id == job_id else None
            info = infos_raw[eid]
            infos[eid] = info if isinstance(info, AgentInfo) else None
            if statuses[eid] is not None:
                run.statuses[eid] = statuses[eid]  # type: ignore[assignment]
            if infos[eid] is not None:
                run.infos[eid] = infos[eid]  # type: ignore[assignment]
        switched = {eid for eid in statuses if _switched(plan, eid, statuses[eid], infos[eid])}
        paused = {eid for eid, s in statuses.items() if s is not None and s.phase in PAUSED_PHASES}
        unreachable = {eid for eid, i in infos.items() if i is None}
        log.warning(
            "job %s (%s): switched=%s paused=%s unreachable=%s", job_id, phase, switched, paused, unreachable
        )

        if run.state == S.cleaning_up or (switched and len(switched) == len(clients)):
            await runner.finish(run)
            return
        if switched:
            # Mixed: complete the commit on the engines still paused for this job, if they all can.
            rest = [c for c in clients if c.engine_id not in switched]
            results = await fleet.each(rest, lambda c: c.switch(job_id))
            if not any(isinstance(r, AgentCallError) for r in results.values()) and rest:
                from app.jobs.runner import JobFailure

                try:
                    await runner.await_phase(
                        run,
                        fleet,
                        rest,
                        {ReconfigPhase.committed},
                        job_phase="committing",
                        deadline_s=runner.settings.switch_deadline_s,
                        poll_interval_s=runner.settings.commit_poll_interval_s,
                    )
                except JobFailure as failure:
                    await _fail_mixed(runner, run, fleet, failure.error)
                    return
                await runner.finish(run)
                return
            error = dict(
                restarted,
                type="partial_switch",
                message=f"{restarted['message']}: {sorted(switched)} switched, the others could not",
            )
            await _fail_mixed(runner, run, fleet, error)
            return
        if paused:
            from app.jobs.runner import JobFailure

            stopped = JobFailure(phase, "coordinator_restarted", str(restarted["message"]))
            await runner._resume_all(run, fleet, stopped)
            return
        # Nobody stopped serving: abort everywhere.
        await fleet.each(clients, lambda c: c.abort(job_id))
        await runner.await_settled(run, fleet, clients, {ReconfigPhase.aborted})
        await runner._release_joiners(run)
        downtime = _downtime_of(runner, run)
        await runner.move(
            run,
            S.rolled_back,
            message=str(restarted["message"]),
            changes={
                "error": restarted,
                "downtime_ms": downtime,
                "engine_results": runner.engine_results(run),
            },
        )


async def _fail_mixed(runner: JobRunner, run: JobRun, fleet: Any, error: dict[str, Any]) -> None:
    """No engine stays paused: resume whoever is still paused, then fail (degraded)."""
    from app.jobs.runner import JobFailure

    paused = [
        runner_client
        for runner_client in run.participant_clients()
        if (s := run.statuses.get(runner_client.engine_id)) is not None and s.phase in PAUSED_PHASES
    ]
    if paused:
        await fleet.each(paused, lambda c: c.abort(run.job_id))
    failure = JobFailure(
        str(error.get("phase")), str(error.get("type")), str(error.get("message")), error.get("engine_id")
    )
    if run.state != S.committing:
        # Only a committing job can fail part-way; a job recorded earlier moves through the log as failed.
        await runner.move(run, S.failed, message=str(error.get("message")), changes={"error": failure.error})
        return
    await runner.fail_switch(run, fleet, failure)


def _downtime_of(runner: JobRunner, run: JobRun) -> float:
    return runner.downtime_of(run, now=time.time()).downtime_ms
