"""How a job ends: the three failure rules and success. The flow and crash recovery both end jobs here.

- `roll_back`: a failure before any engine paused. Abort everywhere, release the joiners; the old
  generation served throughout (downtime 0); `rolled_back`, or `cancelled` on request.
- `resume_all`: a failure once pauses were sent but before the switch. Every participant back on the
  old generation (abort resumes a paused engine), joiners released; `rolled_back` (or `cancelled`)
  with the short downtime it cost.
- `fail_and_degrade`: the switch was sent and failed part-way. Nothing can be undone: the job
  `failed`, the deployment `degraded`, and the job shows which engine is on which generation.
- `finish`: every participant switched. The new generation recorded, leavers released, `succeeded`
  with the retired groups' cleanup pending.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from sqlmodel import Session

from app.backends.base import JobCancelled, JobFailure
from app.backends.reference.fanout import Fanout
from app.backends.reference.front_door import commit_observed, new_rank_set, rank_set_restored
from app.backends.reference.job import JobRun
from app.backends.reference.launching import launch_spec
from app.backends.reference.record import JobRecord, apply_generation, degrade
from app.core.clock import utc_now
from app.core.runner_settings import RunnerSettings, hang_for_test
from app.frontdoor.publish import DoorStep
from app.jobs.models import CleanupState, JobError, ReconfigurationJob
from app.jobs.states import JobState
from app.launchers.base import EngineHandle, Launcher
from engine_agent.protocol import MOVES, ROLLED_BACK, AgentInfo, Operation

log = logging.getLogger(__name__)

S = JobState


class Endings:
    def __init__(
        self,
        record: JobRecord,
        settings: RunnerSettings,
        launchers: Mapping[str, Launcher],
    ) -> None:
        self.record = record
        self.settings = settings
        self.launchers = launchers

    async def roll_back(self, run: JobRun, fanout: Fanout, failure: JobFailure) -> None:
        """A failure before the pause: abort everywhere, release joiners; downtime 0."""
        if run.plan is not None:
            await fanout.abort_all(run, run.participant_clients(), {MOVES[Operation.abort].done})
        await self.release_joiners(run)
        await rank_set_restored(self.record, run)
        await self.record.move(
            run,
            S.cancelled if isinstance(failure, JobCancelled) else S.rolled_back,
            message=failure.error.message,
            changes={
                "error": failure.error,
                "downtime_ms": 0.0,
                "downtime": {"downtime_ms": 0.0, "per_engine_ms": {}},
                "engine_results": run.engine_results(ended_on="old"),
            },
        )

    async def resume_all(self, run: JobRun, fanout: Fanout, failure: JobFailure) -> None:
        """The pause was not confirmed everywhere (or a step inside it failed): every participant back
        on the old generation."""
        await fanout.abort_all(run, run.participant_clients(), ROLLED_BACK)
        await self.release_joiners(run)
        await rank_set_restored(self.record, run)
        await self.record.move(
            run,
            S.cancelled if isinstance(failure, JobCancelled) else S.rolled_back,
            message=f"{failure.error.message}; every engine resumed the old generation",
            changes={
                "error": failure.error,
                **run.downtime_record(now=time.time()),
                "engine_results": run.engine_results(ended_on="old"),
            },
        )

    async def fail_and_degrade(self, run: JobRun, fanout: Fanout, failure: JobFailure) -> None:
        """Part of the engines switched, part did not: the deployment is degraded, the job failed,
        and the job shows which engine is on which generation."""
        # An engine silent in this job is not asked again (a frozen one would hold the end): unreachable.
        answering = [c for c in run.participant_clients() if c.engine_id not in run.silent]
        infos: dict[str, object] = {c.engine_id: None for c in run.participant_clients()}
        infos.update(await fanout.fleet.each(answering, lambda c: c.info()))
        generations = {
            eid: (
                {"generation": i.generation, "state": i.state.value, "rank": i.rank}
                if isinstance(i, AgentInfo)
                else {"generation": None, "state": "unreachable", "rank": None}
            )
            for eid, i in infos.items()
        }
        results = run.engine_results()
        for result in results:
            view = generations.get(result["engine_id"]) or {}
            result["agent"] = view
            if view.get("state") in ("serving", "paused"):  # what it serves, as it says itself
                result["generation_after"] = view.get("generation")
        error = blame_the_silent(failure.error, generations)
        await self.record.move(
            run,
            S.failed,
            message=f"switch failed part-way: {error.message}; deployment degraded",
            changes={
                "error": error,
                "engine_results": results,
                **run.downtime_record(now=time.time()),
            },
            also=lambda session: degrade(session, run.deployment_id, generations, run.job_id),
        )

    async def finish(
        self,
        run: JobRun,
        recorded: Callable[[], Awaitable[None]] | None = None,
        early: asyncio.Task[DoorStep] | Literal["unpublished"] | None = "unpublished",
    ) -> None:
        """Every participant switched and every member confirmed serving: give the front door the new
        rank set (from the observed commit; `early`: published already, while the members were asked)
        while recording the new generation, then `recorded` (the flow's probe figures), release
        leavers, succeed."""
        plan = run.plan
        assert plan is not None
        if early == "unpublished":
            early = None
            if run.state == S.committing:
                early = await commit_observed(self.record, run)  # the front door has it while we record
        if run.state == S.committing:
            downtime = run.downtime()
            recovery = await self.record.run_in_session(lambda session: serving_again(session, run.job_id))

            def commit(session: Session) -> None:
                apply_generation(session, run.deployment_id, plan)

            await self.record.move(
                run,
                S.cleaning_up,
                message=f"generation {plan.generation} serving on {plan.to_size} engines; "
                f"downtime {downtime.downtime_ms:.1f} ms",
                changes={
                    **run.downtime_record(),
                    "engine_results": run.engine_results(ended_on="new"),
                    "to_generation": plan.generation,
                    **recovery,
                },
                also=commit,
            )
        await new_rank_set(self.record, run, early)  # joiners in, leavers out, before the leavers stop
        if recorded is not None:
            await recorded()
        await self.record.progress(run, "cleaning_up")
        await hang_for_test(self.settings, "cleaning_up")
        await self._release(run, run.leaver_handles(), "leavers")
        cleanup_state = CleanupState.pending if plan.old_members else CleanupState.none
        await self.record.move(
            run,
            S.succeeded,
            message="done" if not plan.old_members else "done; retired groups are being destroyed",
            changes={
                "progress_step": "done",
                "progress_percent": 100.0,
                "cleanup_state": cleanup_state.value,
                "cleanup": {"retired_generation": plan.old_generation, "engines": plan.staying + plan.leavers}
                if plan.old_members
                else None,
            },
        )

    async def release_joiners(self, run: JobRun) -> None:
        await self._release(run, run.joiner_handles(), "joiners")

    async def _release(self, run: JobRun, handles: Sequence[EngineHandle], what: str) -> None:
        """Give engines back to the deployment's launcher; forget the ones that no longer exist."""
        launcher = self.launchers.get(run.launcher_name)
        if not handles or launcher is None:
            return
        try:
            gone = await launcher.release(
                launch_spec(self.settings, run.deployment_name, run.engine_config, keys=run.agent_keys),
                handles,
            )
        except Exception:
            log.exception("job %s: releasing %s failed", run.job_id, what)
            return
        if gone:
            await self.record.mark_left(gone)


def blame_the_silent(error: JobError, generations: Mapping[str, Mapping[str, Any]]) -> JobError:
    """The job's error names the engine that caused the failure. An engine killed inside the window
    breaks its peers' collectives, and a peer's report ("connection closed by peer") often reaches
    the coordinator before the dead engine's own call fails: then the job blamed a healthy engine.
    When the engine named answers and a participant does not, name the silent one (keeping what the
    reporter said)."""
    silent = sorted(eid for eid, view in generations.items() if view.get("state") == "unreachable")
    if not silent or error.engine_id in (None, *silent):  # (None: a failure of no one engine)
        return error
    return error.model_copy(
        update={
            "engine_id": silent[0],
            "type": "agent-unreachable",
            "message": f"{', '.join(silent)} stopped answering; {error.engine_id} reported "
            f"{error.type}: {error.message}",
        }
    )


def serving_again(session: Session, job_id: str) -> dict[str, float]:
    """The job-record change for a self-heal job whose new generation serves now (`time_to_serving_ms`);
    empty for any other job."""
    job = session.get(ReconfigurationJob, job_id)
    if job is None or job.loss_at is None:
        return {}
    return {"time_to_serving_ms": round(max(0.0, (utc_now() - job.loss_at).total_seconds() * 1000.0), 1)}
