"""A deployment served by FAKE agents (tests/runner/fakes.py), with the runner's real flow, recovery,
record and database: the in-process stage for the flow's failure rules."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.backends.reference.flow import Flow
from app.backends.reference.liveness.controller import Liveness, Pass
from app.backends.reference.liveness.view import Rules
from app.backends.reference.record import JobRecord
from app.backends.reference.recovery import Recovery
from app.core.clock import utc_now
from app.core.runner_settings import RunnerSettings
from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment
from app.jobs.models import JobEvent, ReconfigurationJob
from app.jobs.service import cancel_job
from engine_agent.protocol import EngineConfig
from tests.runner.fakes import FakeAgent, FakeFleet, FakeLauncher
from tests.support.factories import make_deployment, make_job, register_engines

ENGINE = EngineConfig(num_logical_experts=8, hidden_size=16, intermediate_size=32)


def fast_settings(**overrides: Any) -> RunnerSettings:
    """Short deadlines: a fake agent answers at once, so only a deliberate fault ever waits."""
    values: dict[str, Any] = {
        "enabled": False,
        "coordinator_id": "test-coordinator",
        "agent_poll_interval_s": 0.01,
        "commit_poll_interval_s": 0.005,
        "progress_long_poll_s": 0.2,
        "launch_deadline_s": 30.0,
        "prepare_deadline_s": 30.0,
        "sync_deadline_s": 10.0,
        "pause_deadline_s": 2.0,
        "switch_deadline_s": 5.0,
        "abort_deadline_s": 1.0,
        "rendezvous_s": 0.1,
        "collective_s": 0.1,
        "transfer_s": 0.1,
    }
    values.update(overrides)
    return RunnerSettings(**values)


@dataclass
class Scenario:
    db: DbEngine
    deployment_id: str
    agents: dict[str, FakeAgent]
    serving: list[FakeAgent]
    idle: list[FakeAgent]
    launcher: FakeLauncher
    settings: RunnerSettings
    record: JobRecord = field(init=False)
    flow: Flow = field(init=False)
    recovery: Recovery = field(init=False)
    liveness: Liveness = field(init=False)

    def __post_init__(self) -> None:
        self.restart(self.settings)

    def restart(self, settings: RunnerSettings) -> None:
        """A coordinator (again) with `settings`: a fresh flow and recovery on the same database."""
        self.settings = settings
        launchers = {"local": self.launcher}
        self.record = JobRecord(self.db)
        self.flow = Flow(self.record, self.settings, launchers, "test-coordinator")
        self.recovery = Recovery(self.record, self.settings, launchers)
        self.liveness = self.controller()

    def controller(self, rules: Rules | None = None, *, watching_for_s: float = 3600.0) -> Liveness:
        """The liveness controller of this coordinator, watching for `watching_for_s` already (so the
        heartbeat timeout counts); a process is gone where its fake agent is `unreachable` (a stand-in
        for the real probe, `probes.process_gone`: the fake agents listen nowhere)."""

        async def gone(url: str) -> bool:
            by_url = {row.url: engine_id for engine_id, row in self.engine_rows().items()}
            agent = self.agents.get(by_url.get(url, ""))
            return agent is not None and "unreachable" in agent.faults

        return Liveness(
            self.record,
            {"local": self.launcher},
            rules or Rules(),
            probe=gone,
            watching_since=utc_now() - timedelta(seconds=watching_for_s),
        )

    def liveness_pass(self, *, grace_s: float | None = None) -> Pass:
        """One pass of the liveness controller (`grace_s`: the fence grace for this pass)."""
        if grace_s is not None:
            self.liveness.rules = Rules(fence_grace_s=grace_s)
        try:
            return asyncio.run(self.liveness.tick())
        finally:
            self.liveness.rules = Rules()

    def fleet(self) -> FakeFleet:
        return FakeFleet(self.agents)

    def new_job(self, target: int, **fields: Any) -> str:
        """A job; the coordinator's two-step commit unless `commit` says otherwise (the failure rules
        these tests pin down are that commit's; the engine-agreed one is shown with real agents)."""
        fields.setdefault("commit", "coordinator")
        with Session(self.db, expire_on_commit=False) as session:
            deployment = session.get(Deployment, self.deployment_id)
            assert deployment is not None
            return make_job(session, deployment, target, **fields).id

    async def run(self, job_id: str) -> None:
        async with self.fleet() as fleet:
            await self.flow.run(job_id, fleet)

    async def reconcile(self, job_id: str) -> None:
        async with self.fleet() as fleet:
            await self.recovery.reconcile(job_id, fleet)

    def run_job(self, target: int, **fields: Any) -> ReconfigurationJob:
        return self.run_job_id(self.new_job(target, **fields))

    def run_job_id(self, job_id: str) -> ReconfigurationJob:
        """Run a job created elsewhere (by the runner's scheduled tasks) to its end."""
        asyncio.run(self.run(job_id))
        return self.job(job_id)

    def job(self, job_id: str) -> ReconfigurationJob:
        with Session(self.db, expire_on_commit=False) as session:
            job = session.get(ReconfigurationJob, job_id)
            assert job is not None
            return job

    def events(self, job_id: str) -> list[JobEvent]:
        with Session(self.db, expire_on_commit=False) as session:
            return list(session.exec(select(JobEvent).where(JobEvent.job_id == job_id)).all())

    def deployment(self) -> Deployment:
        with Session(self.db, expire_on_commit=False) as session:
            deployment = session.get(Deployment, self.deployment_id)
            assert deployment is not None
            return deployment

    def engine_rows(self) -> dict[str, Engine]:
        with Session(self.db, expire_on_commit=False) as session:
            rows = session.exec(select(Engine).where(Engine.deployment_id == self.deployment_id)).all()
            return {row.id: row for row in rows}

    def cancel(self, job_id: str) -> None:
        with Session(self.db, expire_on_commit=False) as session:
            cancel_job(session, job_id=job_id, requester="test")


def make_scenario(
    db: DbEngine,
    *,
    serving: int = 2,
    idle: int = 1,
    settings: RunnerSettings | None = None,
    launch_delay_s: float = 0.0,
    engine: EngineConfig = ENGINE,
) -> Scenario:
    """A local-launch deployment on generation 1 with `serving` engines, plus `idle` registered idle
    engines, each a fake agent; the launcher starts more fake agents on demand."""
    agents: dict[str, FakeAgent] = {}
    with Session(db, expire_on_commit=False) as session:
        deployment = make_deployment(
            session, "demo", engine=engine.model_dump(), min_dp_size=1, max_dp_size=8
        )
        rows = register_engines(session, deployment, serving + idle)
        for index, row in enumerate(rows):
            member = index < serving
            row.state = EngineState.serving.value if member else EngineState.idle.value
            row.dp_rank = index if member else None
            row.generation = 1 if member else 0
            row.world_size = serving if member else 0
            session.add(row)
            agents[row.id] = FakeAgent(
                row.id,
                engine=engine,
                generation=row.generation,
                rank=row.dp_rank,
                world_size=row.world_size,
                port=20000 + index,
            )
        deployment.current_dp_size = serving
        deployment.generation = 1
        session.add(deployment)
        session.commit()
        deployment_id = deployment.id
    ordered = list(agents.values())
    return Scenario(
        db=db,
        deployment_id=deployment_id,
        agents=agents,
        serving=ordered[:serving],
        idle=ordered[serving:],
        launcher=FakeLauncher(agents, engine, launch_delay_s=launch_delay_s),
        settings=settings or fast_settings(),
    )


def crashed_at(db: DbEngine, tmp_path: Path, point: str, **job_fields: object) -> tuple[Scenario, str]:
    """A scale 2 -> 3 whose coordinator died at `point` (the runner's own test hook stops it there, then
    its task is cancelled as a crash would end it); `stage` is then the successor, without the hook."""
    marker = tmp_path / "marker"
    stage = make_scenario(db, settings=fast_settings(test_hang_at=point, test_marker_file=marker))
    job_id = stage.new_job(3, **job_fields)

    async def go() -> None:
        running = asyncio.create_task(stage.run(job_id))
        while not marker.exists():
            assert not running.done(), running
            await asyncio.sleep(0.01)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    asyncio.run(go())
    assert marker.read_text() == point
    stage.restart(fast_settings())  # the successor: no test hook
    return stage, job_id
