"""Warm spares (issue 38): keep `spares` engines launched, registered and holding every expert beyond a
reference deployment's size (the reference backend's periodic task `spares`).

Each pass reads the deployments that keep spares and, for each one that is settled (ready, no job
active, no loss being healed: a heal or a job may be taking a spare right now), compares the engines
that count as its spares (`app.deployments.spares`: idle, never a member) with `spares`:

- fewer: the missing ones are launched in the background through the deployment's launcher (the pass
  never waits on a launch: the liveness pass runs in the same loop) and recorded idle;
- each spare not yet warm is asked to hold every expert (`POST /v1/spare`), once per engine;
- more (`spares` lowered): the newest extras are given back to their launcher.

A spare joins like any idle engine: self-heal forms the new generation on the survivors and a spare
(`liveness.heal`), a grow takes idle engines first (`planner`); its rows then come from what it holds
(bytes `resident`, none loaded). The pass after that launches its replacement. Two coordinators may each
launch a spare in the same moment: the extra one is given back by the next pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from sqlmodel import Session, col, select

from app.agents.errors import AgentCallError
from app.agents.fleet import Fleet
from app.backends.reference.launching import launch_spec
from app.coordinators import service as coordinators
from app.core import changes
from app.core.runner_settings import RunnerSettings
from app.deployments.agent_keys import agent_keys_of, previous_until_epoch
from app.deployments.engines.models import Engine, EngineState
from app.deployments.engines.service import record_launched
from app.deployments.models import Deployment, DeploymentStatus, EngineBackend
from app.deployments.spares import SPARE_STATES, spares_among
from app.jobs.active import active_job_ids
from app.jobs.async_record import WorkerSessions
from app.jobs.models import ReconfigurationJob
from app.launchers.base import EngineHandle, Launcher, LaunchSpec
from engine_agent.protocol import EngineConfig

log = logging.getLogger(__name__)

# The tables a pass reads: the deployments, their active jobs, their engines.
WATCHED = (Deployment.__tablename__, ReconfigurationJob.__tablename__, Engine.__tablename__)


@dataclass(frozen=True)
class SpareNeed:
    """One settled deployment's spares as the record has them, and what to do."""

    deployment_id: str
    name: str
    launcher: str
    spec: LaunchSpec
    keys: tuple[str, ...]
    spares: list[EngineHandle]  # those it has, oldest first
    launch: int  # how many to launch
    extra: list[EngineHandle]  # beyond `spares`: to give back


def plan_spares(wanted: int, engines: list[Engine]) -> tuple[list[Engine], int, list[Engine]]:
    """(the spares it has, how many to launch, the extras to give back) for `wanted` spares among a
    deployment's engines (pure)."""
    every = spares_among(engines, len(engines))
    has = every[:wanted]
    return has, max(0, wanted - len(has)), every[wanted:]


def _settled(deployment: Deployment, active: Mapping[str, str]) -> bool:
    return (
        deployment.status == DeploymentStatus.ready.value
        and not deployment.heal_lost
        and deployment.heal_target_dp_size is None
        and deployment.id not in active
    )


def needs(session: Session, settings: RunnerSettings, kept: Collection[str] = frozenset()) -> list[SpareNeed]:
    """What each settled deployment keeping (or having kept) spares needs now, in three queries for any
    number of deployments (issue 37: 128 deployments, every `SPARES_INTERVAL_S`). `kept`: engines their
    launcher kept when given back (a static pool's): never extras again."""
    found: list[SpareNeed] = []
    deployments = session.exec(
        select(Deployment).where(col(Deployment.backend) == EngineBackend.reference.value)
    ).all()
    active = active_job_ids(session, [d.id for d in deployments])
    settled = {d.id: d for d in deployments if _settled(d, active)}
    by_deployment: dict[str, list[Engine]] = {}
    if settled:
        for engine in session.exec(
            select(Engine).where(
                col(Engine.deployment_id).in_(list(settled)), col(Engine.state).in_(SPARE_STATES)
            )
        ).all():
            by_deployment.setdefault(engine.deployment_id, []).append(engine)
    live: list[str] | None = None
    for deployment in settled.values():
        engines = by_deployment.get(deployment.id, [])
        has, launch, extra = plan_spares(deployment.spares, engines)
        extra = [e for e in extra if e.id not in kept]
        if not launch and not extra and not has:
            continue
        if live is None:
            live = coordinators.live_urls(session, first=settings.public_url)
        keys = agent_keys_of(deployment)
        spec = launch_spec(
            settings,
            deployment.name,
            EngineConfig.model_validate(deployment.engine_config),
            live,
            keys=keys,
            previous_until=previous_until_epoch(deployment),
            launch_timeout_s=deployment.launch_timeout_s,
        )
        found.append(
            SpareNeed(
                deployment_id=deployment.id,
                name=deployment.name,
                launcher=deployment.launcher,
                spec=spec,
                keys=keys,
                spares=[EngineHandle(e.id, e.url, e.pid) for e in has],
                launch=launch,
                extra=[EngineHandle(e.id, e.url, e.pid) for e in extra],
            )
        )
    return found


class SpareKeeper:
    """The periodic task: one pass reads what is needed, launches and warms in the background."""

    def __init__(
        self,
        record: WorkerSessions,
        settings: RunnerSettings,
        launchers: Mapping[str, Launcher],
        new_fleet: Callable[[], Fleet],
    ) -> None:
        self.record = record
        self.settings = settings
        self.launchers = launchers
        self.new_fleet = new_fleet
        self.warm: set[str] = set()  # engines that answered `POST /v1/spare` (this coordinator's memory)
        self.busy: dict[str, asyncio.Task[None]] = {}  # deployment id -> its launch or warm-up
        # Engines given back that their launcher kept (a static pool keeps its registered agents): offered
        # again at every pass they would be given back, and logged, for ever (issue 37).
        self.kept: set[str] = set()
        self.gate = changes.PassGate(WATCHED)
        self.working = False  # the last pass left a launch or warm-up to follow: the next one runs

    async def tick(self) -> None:
        # Only where what it reads moved (issue 37: a steady fleet's heartbeats move nothing;
        # `app.core.changes`), or the last pass left work (a launch or warm-up running, or one that
        # failed and is tried again), or at least every `FULL_PASS_EVERY_S` (another coordinator's).
        started = self.gate.start(busy=self.working)
        if started is None:
            return
        kept = frozenset(self.kept)
        found = await self.record.run_in_session(lambda session: needs(session, self.settings, kept))
        working = False
        for need in found:
            task = self.busy.get(need.deployment_id)
            if task is not None and not task.done():
                working = True
                continue
            cold = [h for h in need.spares if h.engine_id not in self.warm]
            if need.launch or need.extra or cold:
                self.busy[need.deployment_id] = asyncio.create_task(self._keep(need, cold))
                working = True
        self.working = working
        self.gate.ran(started)

    async def _keep(self, need: SpareNeed, cold: list[EngineHandle]) -> None:
        launcher = self.launchers.get(need.launcher)
        try:
            if launcher is not None and need.extra:
                log.info("deployment %s: giving back spares beyond %d: %s", need.name,
                         len(need.spares), [h.engine_id for h in need.extra])  # fmt: skip
                gone = await launcher.release(need.spec, need.extra)
                self.kept.update(h.engine_id for h in need.extra if h.engine_id not in gone)
                if gone:
                    await self.record.run_in_session(lambda session: _mark_left(session, gone))
            if launcher is not None and need.launch:
                budget = launcher.launch_budget(need.spec, self.settings.launch_deadline_s)
                launched = await launcher.ensure_engines(
                    need.spec, need.launch, [], deadline_s=budget.deadline_s
                )
                async with self.new_fleet() as fleet:
                    clients = [fleet.client(h.engine_id, h.url, need.keys) for h in launched]
                    infos = list((await fleet.all(clients, lambda c: c.info())).values())
                await self.record.run_in_session(
                    lambda session: record_launched(session, need.deployment_id, need.launcher, infos)
                )
                log.info("deployment %s: launched spare(s) %s", need.name, [h.engine_id for h in launched])
                cold = [*cold, *launched]
            await self._warm(need, cold)
        except asyncio.CancelledError:
            raise
        except Exception:  # a launch that failed is tried again at a later pass
            log.exception("deployment %s: keeping its spares failed", need.name)

    async def _warm(self, need: SpareNeed, cold: list[EngineHandle]) -> None:
        if not cold:
            return
        async with self.new_fleet() as fleet:
            clients = [fleet.client(h.engine_id, h.url, need.keys) for h in cold]
            # Loading every expert can take longer than one agent call's default deadline.
            held = await fleet.each(clients, lambda c: c.hold_as_spare(timeout_s=60.0))
        for engine_id, result in held.items():
            if isinstance(result, AgentCallError):
                log.warning("deployment %s: spare %s did not warm: %s", need.name, engine_id, result)
                continue
            self.warm.add(engine_id)
            log.info("deployment %s: spare %s holds %d bytes", need.name, engine_id, result.spare_bytes)

    async def stop(self) -> None:
        tasks = [t for t in self.busy.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _mark_left(session: Session, engine_ids: list[str]) -> None:
    for engine_id in engine_ids:
        row = session.get(Engine, engine_id)
        if row is not None:
            row.state = EngineState.left.value
            session.add(row)
    session.commit()
