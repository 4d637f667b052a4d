"""A small test driver that plays the coordinator against real agent processes.

It starts `python -m engine_agent.main` processes on loopback (port 0 + --ready-file), and drives a
reconfiguration through their HTTP API exactly as the coordinator's runner must:

    participants = old members + joiners
    POST /v1/reconfig/prepare (same PrepareRequest to every participant)  -> poll until all `prepared`
    background: POST sync -> poll `synced`;  POST pause -> poll `paused`;  POST switch -> poll `committed`
    background, commit="engines": POST sync -> poll `synced`;  POST arm -> poll `committed`
    blocking:   POST pause -> poll `paused`;  POST sync -> poll `synced`;  POST switch -> poll `committed`
    any participant `failed` before switch -> POST abort to all -> poll `aborted`
"""

from __future__ import annotations

import itertools
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from engine_agent import moe
from engine_agent.engine_options import engine_args
from engine_agent.placement import rebalance
from engine_agent.protocol import (
    AgentInfo,
    EngineConfig,
    Member,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
    Settlement,
    Strategy,
    Timeouts,
    TransferBackend,
    WarmupPolicy,
    is_settled,
)
from tests.support import processes
from tests.support.agent_zygote import Zygote

SMALL = EngineConfig(
    num_logical_experts=8, num_redundant_experts=2, hidden_size=32, intermediate_size=64, top_k=2, seed=7
)
SHORT = Timeouts(rendezvous_s=10.0, collective_s=10.0, transfer_s=10.0, pause_lease_s=10.0)
REL_TOL = 1e-5
POLL_S = 0.02


@dataclass
class AgentProcess:
    engine_id: str
    url: str
    process: processes.ProcessHandle
    log_path: Path
    client: httpx.Client

    def info(self) -> AgentInfo:
        return AgentInfo.model_validate(self.get("/v1/info").json())

    def get(self, path: str) -> httpx.Response:
        return self.client.get(path)

    def post(self, path: str, body: object | None = None) -> httpx.Response:
        return self.client.post(path, json=body if body is not None else {})

    def status(self) -> ReconfigStatus:
        response = self.get("/v1/reconfig")
        response.raise_for_status()
        return ReconfigStatus.model_validate(response.json())

    def infer(self, tokens: torch.Tensor) -> httpx.Response:
        return self.post("/v1/infer", {"tokens": tokens.tolist()})

    def faults(self, **switches: object) -> None:
        self.post("/v1/faults", switches).raise_for_status()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_agents(
    count: int,
    workdir: Path,
    *,
    config: EngineConfig = SMALL,
    prefix: str = "e",
    first: int = 0,
    extra_args: Iterable[str] = ("--enable-fault-injection",),
    platform: str = "cpu",
    device: str | None = None,
    ready_timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    zygote: Zygote | None = None,
) -> list[AgentProcess]:
    """Start `count` agent processes at once (the harness's) and wait until every one serves HTTP;
    `zygote`: forked from that warmed interpreter (torch imported once)."""
    flags = {"platform": platform, "log_level": "info", **({"device": device} if device else {})}
    started = processes.start_agents(
        [f"{prefix}{index}" for index in range(first, first + count)],
        workdir,
        flags=flags,
        engine_args=[*engine_args(config), *extra_args],
        ready_timeout_s=ready_timeout_s,
        env=env,
        zygote=zygote,
    )
    return [
        AgentProcess(
            a.engine_id,
            a.url,
            a.child.popen,
            a.child.log_path,
            httpx.Client(base_url=a.url, timeout=30, headers=processes.AGENT_KEY_HEADERS),
        )
        for a in started
    ]


def stop_agents(agents: Iterable[AgentProcess]) -> None:
    agents = list(agents)
    for agent in agents:
        agent.client.close()
        if agent.process.poll() is None:
            agent.process.terminate()
    for agent in agents:
        try:
            agent.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.process.kill()
            agent.process.wait(timeout=5)


class JobFailed(AssertionError):
    def __init__(self, message: str, statuses: dict[str, ReconfigStatus]) -> None:
        super().__init__(message)
        self.statuses = statuses


@dataclass
class JobOutcome:
    job_id: str
    statuses: dict[str, ReconfigStatus]

    def downtime_ms(self) -> float:
        """Union of the old members' stopped windows (first pause to last resume)."""
        windows = [
            (s.pause.paused_at, s.pause.resumed_at)
            for s in self.statuses.values()
            if s.pause is not None and s.pause.resumed_at is not None and s.role != "joining"
        ]
        if not windows:
            return 0.0
        return (max(end for _, end in windows) - min(start for start, _ in windows)) * 1000.0


@dataclass
class Driver:
    """Plays the coordinator: owns the deployment's generation, members and placement."""

    config: EngineConfig = field(default_factory=lambda: SMALL.model_copy())
    timeouts: Timeouts = field(default_factory=lambda: SHORT.model_copy())
    generation: int = 0
    members: list[AgentProcess] = field(default_factory=list)
    placement: list[list[int]] = field(default_factory=list)

    def plan(self, new_members: list[AgentProcess]) -> list[list[int]]:
        load = [0] * self.config.num_logical_experts
        for agent in self.members:
            load = [a + b for a, b in zip(load, agent.info().expert_load, strict=True)]
        return rebalance(
            load,
            self.config.num_redundant_experts,
            len(new_members),
            num_logical=self.config.num_logical_experts,
        )

    def prepare_request(
        self,
        new_members: list[AgentProcess],
        *,
        job_id: str | None = None,
        strategy: Strategy = Strategy.background,
        policy: WarmupPolicy = WarmupPolicy.eager,
        backend: TransferBackend = TransferBackend.gloo,
        timeouts: Timeouts | None = None,
    ) -> PrepareRequest:
        return PrepareRequest(
            job_id=job_id or f"job-{uuid.uuid4().hex[:8]}",
            generation=self.generation + 1,
            old_generation=self.generation,
            members=[Member(engine_id=a.engine_id, url=a.url) for a in new_members],
            old_members=[Member(engine_id=a.engine_id, url=a.url) for a in self.members],
            old_placement=self.placement,
            placement=self.plan(new_members),
            store=new_members[0].info().store,  # hosted by the new rank 0's agent
            warmup_policy=policy,
            strategy=strategy,
            transfer_backend=backend,
            timeouts=timeouts or self.timeouts,
        )

    @staticmethod
    def participants(request: PrepareRequest, agents: Iterable[AgentProcess]) -> list[AgentProcess]:
        by_id = {a.engine_id: a for a in agents}
        old = [m.engine_id for m in request.old_members]
        order = old + [m.engine_id for m in request.members if m.engine_id not in old]
        return [by_id[e] for e in order]

    def reconfigure(
        self,
        new_members: list[AgentProcess],
        *,
        during_prepare: Callable[[], None] | None = None,
        commit: str = "coordinator",
        arm_deadline_s: float = 10.0,
        max_downtime_ms: int | None = None,
        **options: object,
    ) -> JobOutcome:
        """One whole job; on failure before switch, abort everywhere and raise JobFailed. With
        `commit="engines"` the engines are armed after sync and switch at the boundary they agree on."""
        request = self.prepare_request(new_members, **options)  # type: ignore[arg-type]
        everyone = self.participants(request, [*self.members, *new_members])
        job = {"job_id": request.job_id}
        try:
            self.post_all(everyone, "/v1/reconfig/prepare", request.model_dump(mode="json"))
            if during_prepare is not None:
                during_prepare()
            self.wait_phase(everyone, ReconfigPhase.prepared)
            if request.strategy == Strategy.background and commit == "engines":
                self.post_all(everyone, "/v1/reconfig/sync", job)
                self.wait_phase(everyone, ReconfigPhase.synced)
                arm = {**job, "deadline_s": arm_deadline_s, "max_downtime_ms": max_downtime_ms}
                self.post_all(everyone, "/v1/reconfig/arm", arm)
                statuses = self.wait_phase(everyone, ReconfigPhase.committed, timeout_s=arm_deadline_s + 30)
                return self._committed(request, new_members, statuses)
            if request.strategy == Strategy.background:
                self.post_all(everyone, "/v1/reconfig/sync", job)
                self.wait_phase(everyone, ReconfigPhase.synced)
                self.post_all(everyone, "/v1/reconfig/pause", job)
                self.wait_phase(everyone, ReconfigPhase.paused)
            else:
                self.post_all(everyone, "/v1/reconfig/pause", job)
                self.wait_phase(everyone, ReconfigPhase.paused)
                self.post_all(everyone, "/v1/reconfig/sync", job)
                self.wait_phase(everyone, ReconfigPhase.synced)
        except JobFailed:
            self.abort(everyone, request.job_id)
            raise
        self.post_all(everyone, "/v1/reconfig/switch", job)
        return self._committed(request, new_members, self.wait_phase(everyone, ReconfigPhase.committed))

    def _committed(
        self, request: PrepareRequest, new_members: list[AgentProcess], statuses: dict[str, ReconfigStatus]
    ) -> JobOutcome:
        self.generation = request.generation
        self.members = list(new_members)
        self.placement = request.placement
        return JobOutcome(request.job_id, statuses)

    def abort(self, agents: list[AgentProcess], job_id: str) -> dict[str, ReconfigStatus]:
        self.post_all(agents, "/v1/reconfig/abort", {"job_id": job_id})
        return self.wait_phase(agents, ReconfigPhase.aborted)

    @staticmethod
    def post_all(agents: list[AgentProcess], path: str, body: object) -> None:
        for agent in agents:
            response = agent.post(path, body)
            if response.status_code != 202:
                raise AssertionError(f"{agent.engine_id} {path}: {response.status_code} {response.text}")

    @staticmethod
    def wait_step(agent: AgentProcess, step: str, timeout_s: float = 30.0) -> ReconfigStatus:
        """Poll until the agent's job is at `step` (e.g. held there by hang_prepare_at_step)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = agent.status() if agent.get("/v1/reconfig").status_code == 200 else None
            if status is not None and status.step == step:
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"{agent.engine_id} never reached step {step}: {status}")
            time.sleep(POLL_S)

    def wait_phase(
        self, agents: list[AgentProcess], phase: ReconfigPhase, timeout_s: float = 30.0
    ) -> dict[str, ReconfigStatus]:
        """Poll until every agent's job reaches `phase`; raise JobFailed as soon as one cannot
        (`protocol.is_settled`: a terminal phase not asked for, or an error outside the way back)."""
        deadline = time.monotonic() + timeout_s
        while True:
            statuses = {a.engine_id: a.status() for a in agents}
            settled = {e: is_settled(s, s.job_id, {phase}) for e, s in statuses.items()}
            failed = {e: statuses[e] for e, state in settled.items() if state == Settlement.failed}
            if failed:
                detail = "; ".join(f"{e}: {s.phase} {s.error}" for e, s in failed.items())
                raise JobFailed(f"failed while waiting for {phase}: {detail}", statuses)
            if all(state == Settlement.reached for state in settled.values()):
                return statuses
            if time.monotonic() > deadline:
                raise JobFailed(
                    f"not all {phase} within {timeout_s} s: "
                    + str({e: s.phase for e, s in statuses.items()}),
                    statuses,
                )
            time.sleep(POLL_S)


_seeds = itertools.count(1000)


def random_tokens(config: EngineConfig, count: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(next(_seeds))
    return torch.randn(count, config.hidden_size, generator=generator)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def assert_serves_reference(
    agents: Iterable[AgentProcess], config: EngineConfig = SMALL, tokens: int = 5, rel_tol: float = REL_TOL
) -> None:
    """Every agent answers an inference with the single-process reference output (fp32 rel < 1e-5)."""
    for agent in agents:
        batch = random_tokens(config, tokens)
        response = agent.infer(batch)
        assert response.status_code == 200, f"{agent.engine_id}: {response.status_code} {response.text}"
        got = torch.tensor(response.json()["outputs"])
        error = relative_error(got, moe.reference_forward(config, batch))
        assert error < rel_tol, f"{agent.engine_id}: relative error {error}"
