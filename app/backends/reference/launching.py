"""Who takes part in a job: ask every known engine for `/v1/info`, launch what is missing (a cancel
stops the launch at once), and plan. The first part of the prepare step."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from app.agents.errors import AgentCallError
from app.agents.fleet import Fleet
from app.backends.base import JobCancelled, JobFailure
from app.backends.reference.fencing import grant_generation
from app.backends.reference.job import JobRun
from app.backends.reference.planner import DeploymentSpec, JobOptions, make_plan
from app.backends.reference.record import JobRecord, is_member_row
from app.coordinators import service as coordinators
from app.core.runner_settings import RunnerSettings
from app.deployments.engines.models import Engine
from app.deployments.models import Deployment
from app.launchers.base import EngineHandle, Launcher, LaunchError, LaunchSpec
from engine_agent.protocol import AgentInfo, AgentState, EngineConfig

T = TypeVar("T")

log = logging.getLogger(__name__)

PHASE = "preparing"
# How often a launch in progress checks for a cancel (seconds).
CANCEL_CHECK_S = 0.2


def launch_spec(
    settings: RunnerSettings,
    deployment: str,
    engine: EngineConfig,
    coordinators: Sequence[str] = (),
    *,
    keys: Sequence[str] = (),
    previous_until: float | None = None,
    launch_timeout_s: float | None = None,
) -> LaunchSpec:
    """What a launcher is told about the deployment it starts (or releases) engines for. `coordinators`:
    every live coordinator sharing the database (this one first), for the agents to fail over between.
    `keys`: the deployment's agent keys (`agent_keys_of`); a previous key goes only with its end,
    `previous_until` (wall-clock epoch seconds, from the sealed record). `launch_timeout_s`: the
    deployment's launch readiness timeout (None: adaptive)."""
    urls = list(dict.fromkeys([*coordinators, *([settings.public_url] if settings.public_url else [])]))
    return LaunchSpec(
        deployment=deployment,
        engine=engine,
        coordinator_url=",".join(urls) or None,
        token=settings.agent_token,
        extra_args=tuple(shlex.split(settings.local_agent_args)),
        agent_key=keys[0] if keys else None,
        agent_key_previous=keys[1] if len(keys) > 1 and previous_until is not None else None,
        agent_key_previous_until=previous_until if len(keys) > 1 else None,
        launch_timeout_s=launch_timeout_s,
    )


class Participants:
    def __init__(
        self, record: JobRecord, settings: RunnerSettings, launchers: Mapping[str, Launcher]
    ) -> None:
        self.record = record
        self.settings = settings
        self.launchers = launchers

    async def plan(self, run: JobRun, fleet: Fleet) -> None:
        """Fill `run.plan`, `run.infos`, `run.clients` and `run.launched`. Raises `JobFailure` (a member
        that does not answer, a launch or plan that fails), `JobCancelled` on request."""
        deployment, rows, target = await self.record.deployment_and_engines(run)
        await self.record.progress(run, "launching")
        infos = await self._agent_infos(fleet, deployment, rows, run.agent_keys)
        members_now = [
            i for i in infos if i.state != AgentState.idle and i.generation == deployment.generation
        ]
        idle = [i for i in infos if i.state == AgentState.idle]
        need = target - len(members_now)
        partial = need > 0 and not run.all_or_nothing
        shortfall: LaunchError | None = None
        if need > 0 and len(idle) < need:
            # Starting engines takes seconds to tens of seconds: the step names what it waits for.
            starting = need - len(idle)
            await self.record.progress(run, f"launching: {starting} new engine{'s' if starting != 1 else ''}")
            handles = [EngineHandle(engine_id=i.engine_id, url=i.url) for i in idle]
            ready, shortfall = await self._launch(run, need, handles, partial=partial)
            known = {i.engine_id for i in idle}
            run.launched = [h for h in ready if h.engine_id not in known]
            new_infos = list(
                (
                    await fleet.all(
                        [fleet.client(h.engine_id, h.url, run.agent_keys) for h in run.launched],
                        lambda c: c.info(),
                    )
                ).values()
            )
            await self.record.add_engines(run, new_infos)
            infos += new_infos
            idle += new_infos
        if partial:
            target = await self._reachable(run, len(members_now), len(idle), target, shortfall)
        spec = DeploymentSpec(
            name=deployment.name,
            num_logical_experts=run.engine_config.num_logical_experts,
            num_redundant_experts=run.engine_config.num_redundant_experts,
            generation=deployment.generation,
            warmup_policy=deployment.warmup_policy,  # type: ignore[arg-type]
            expert_nbytes=run.engine_config.expert_nbytes,
            num_moe_layers=run.engine_config.num_moe_layers,
        )
        options = JobOptions(
            warmup_policy=run.warmup_requested,  # type: ignore[arg-type]
            strategy=run.strategy,
            transfer_backend=self.settings.transfer_backend,
            retire=run.retire,
        )
        plan = make_plan(spec, members_now + idle, target, options)
        granted = await self.record.run_in_session(
            lambda session: grant_generation(
                session,
                job_id=run.job_id,
                deployment_id=run.deployment_id,
                reported=[i.generation for i in infos],
            )
        )
        run.plan = dataclasses.replace(plan, generation=granted)
        run.infos = {i.engine_id: i for i in infos}
        run.clients = {
            m.engine_id: fleet.client(m.engine_id, m.url, run.agent_keys) for m in run.plan.participants
        }

    async def _reachable(
        self, run: JobRun, members: int, idle: int, target: int, shortfall: LaunchError | None
    ) -> int:
        """A partial grow's size: `target`, or as far as the idle engines reach (the rest stands as the
        deployment's target, `app.scale.standing`). Reaching no further than now fails the job, with
        the launcher's error where it gave one (as an all-or-nothing grow would)."""
        reach = reachable_size(members, idle, target)
        if reach is None:
            if shortfall is not None:
                raise shortfall
            raise JobFailure(
                PHASE,
                "not-enough-engines",
                f"growing {run.deployment_name} to {target} found no engine to add ({members} serving, none "
                "idle, none launched)",
            )
        if reach < target:
            log.info("partial growth of %s: %d of %d engines", run.deployment_name, reach, target)
            await self.record.progress(run, f"partial growth: {reach} of {target} engines (the rest stands)")
        return reach

    async def _launch(
        self, run: JobRun, need: int, idle: Sequence[EngineHandle], *, partial: bool = False
    ) -> tuple[list[EngineHandle], LaunchError | None]:
        """`need` engines from the launcher (`partial`: as many as it can make available, with what
        kept it from the rest). A cancel requested meanwhile stops the launch (the launcher stops what
        it started) and raises `JobCancelled`."""
        launcher = self.launchers.get(run.launcher_name)
        if launcher is None:
            raise JobFailure(PHASE, "unknown-launcher", f"no launcher {run.launcher_name!r} is configured")
        public_url = self.settings.public_url
        live = await self.record.run_in_session(lambda s: coordinators.live_urls(s, first=public_url))
        spec = launch_spec(
            self.settings,
            run.deployment_name,
            run.engine_config,
            live,
            keys=run.agent_keys,
            previous_until=run.agent_key_previous_until,
            launch_timeout_s=run.launch_timeout_s,
        )
        budget = launcher.launch_budget(spec, self.settings.launch_deadline_s)
        await self.record.note(run, "launch", f"launching {need - len(idle)} engine(s): {budget.describe()}")
        launch = asyncio.ensure_future(
            self._ensure(launcher, partial, spec, need, idle, deadline_s=budget.deadline_s)
        )
        told: set[str] = set()

        async def tell_who_is_late() -> None:
            # A launch past its deadline that is waited for all the same says so, once, in the job's log.
            for engine, note in sorted(launcher.still_starting(run.deployment_name).items()):
                if engine not in told:
                    told.add(engine)
                    await self.record.note(run, "launch", note)

        return await until_cancelled(
            launch, lambda: self.record.cancel_requested(run), PHASE, tell_who_is_late
        )

    @staticmethod
    async def _ensure(
        launcher: Launcher,
        partial: bool,
        spec: LaunchSpec,
        need: int,
        idle: Sequence[EngineHandle],
        *,
        deadline_s: float,
    ) -> tuple[list[EngineHandle], LaunchError | None]:
        if partial:
            return await launcher.ensure_some(spec, need, idle, deadline_s=deadline_s)
        return await launcher.ensure_engines(spec, need, idle, deadline_s=deadline_s), None

    async def _agent_infos(
        self, fleet: Fleet, deployment: Deployment, rows: Sequence[Engine], keys: Sequence[str]
    ) -> list[AgentInfo]:
        """Every known engine's `/v1/info`. A current member that does not answer fails the job; an
        idle engine that does not answer is skipped."""
        clients = [fleet.client(row.id, row.url, keys) for row in rows]
        results = await fleet.each(clients, lambda c: c.info())
        infos: list[AgentInfo] = []
        for row in rows:
            result = results[row.id]
            if isinstance(result, AgentCallError):
                if is_member_row(row, deployment) and deployment.generation > 0:
                    raise JobFailure.from_exception(PHASE, result)
                # An idle engine that does not answer (down, or its certificate not the operator's CA's).
                log.warning("idle engine %s skipped: %s", row.id, result)
                continue
            infos.append(result)
        return infos


def reachable_size(members: int, idle: int, target: int) -> int | None:
    """The size a partial grow commits: `target` where enough engines are idle, else the members and
    every idle engine; None where that adds nothing (the job fails, nothing committed)."""
    reach = min(target, members + idle)
    return reach if reach > members else None


async def until_cancelled(
    work: asyncio.Future[T],
    cancelled: Callable[[], Awaitable[bool]],
    phase: str,
    tick: Callable[[], Awaitable[None]] | None = None,
) -> T:
    """`work`'s result, unless `cancelled()` turns true first (checked every `CANCEL_CHECK_S`): then
    `work` is cancelled (and awaited, so it cleans up) and `JobCancelled` raised. `tick` runs at each
    check (what the job's log says meanwhile)."""
    try:
        while True:
            done, _ = await asyncio.wait({work}, timeout=CANCEL_CHECK_S)
            if done:
                return work.result()
            if tick is not None:
                await tick()
            if await cancelled():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                raise JobCancelled(phase)
    finally:
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
