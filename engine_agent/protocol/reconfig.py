"""One reconfiguration as the coordinator drives it: the requests (prepare, pause, arm, ...), the
agent's status, and its background cleanup."""

from __future__ import annotations

import secrets
from collections.abc import Collection
from enum import StrEnum

from pydantic import BaseModel, Field

from engine_agent.choreography import RECOVERING_PHASES, TERMINAL_PHASES, ReconfigPhase, Strategy
from engine_agent.protocol.bounds import MAX_JOB_TIMEOUT_S, MAX_PAUSE_LEASE_S, MAX_SERVING_COLLECTIVE_S


class WarmupPolicy(StrEnum):
    eager = "eager"  # first collective on the new groups during prepare
    deferred = "deferred"  # first collective inside the paused window (ROCm/RCCL safety)


class TransferBackend(StrEnum):
    nixl = "nixl"  # one-sided READs through NIXL/UCX, as production engines do
    gloo = "gloo"  # send/recv over a transfer process group: the fallback


class LeavePolicy(StrEnum):
    finish = "finish"  # a leaving engine stops admitting at prepare and drains before it pauses


class Role(StrEnum):
    joining = "joining"  # in the new generation only
    staying = "staying"  # in both
    leaving = "leaving"  # in the old generation only


class Settlement(StrEnum):
    """Where one agent's reconfiguration stands against the phases a caller waits for."""

    pending = "pending"  # another job (or none) is there yet, or this job is still on its way
    reached = "reached"  # in one of the wanted phases
    failed = "failed"  # ended in another terminal phase, or reports an error on its way


def is_settled(status: ReconfigStatus | None, job_id: str, wanted: Collection[ReconfigPhase]) -> Settlement:
    """The one rule for "wait until an agent reaches phase X", shared by the coordinator, the agent's
    long-poll, the tests and the benchmarks. A wanted phase counts even when it carries an error: an
    `aborted` that reports the failure that caused the abort has still reached `aborted`. Otherwise a
    terminal phase, or an error outside the way back (`RECOVERING_PHASES`), means the wait has failed."""
    if status is None or status.job_id != job_id:
        return Settlement.pending
    if status.phase in wanted:
        return Settlement.reached
    if status.phase in TERMINAL_PHASES:
        return Settlement.failed
    if status.error is not None and status.phase not in RECOVERING_PHASES:
        return Settlement.failed
    return Settlement.pending


class StoreAddress(BaseModel):
    """A rendezvous store (torch TCPStore) hosted by one agent; generations use their own prefix."""

    host: str
    port: int = Field(ge=1, le=65535)


class Member(BaseModel):
    engine_id: str
    url: str
    data: StoreAddress | None = Field(
        None,
        description="its data address (its own rendezvous store's, which listens there): what peers probe "
        "to tell whether the data network reaches it",
    )


class Timeouts(BaseModel):
    rendezvous_s: float = Field(30.0, gt=0, le=MAX_JOB_TIMEOUT_S)
    collective_s: float = Field(30.0, gt=0, le=MAX_JOB_TIMEOUT_S)
    serving_collective_s: float = Field(
        5.0,
        gt=0,
        le=MAX_SERVING_COLLECTIVE_S,
        description="deadline of one serving collective once every member of the generation stepped on "
        "it (the first step after a switch or resume waits up to `collective_s`); a peer that stalls "
        "longer breaks the generation",
    )
    transfer_s: float = Field(120.0, gt=0, le=MAX_JOB_TIMEOUT_S)
    pause_lease_s: float = Field(10.0, gt=0, le=MAX_PAUSE_LEASE_S)


class PrepareRequest(BaseModel):
    job_id: str
    generation: int = Field(ge=1, description="the new generation's number (old generation + 1)")
    old_generation: int = Field(ge=0)
    members: list[Member] = Field(description="the new generation; list index = new DP rank")
    old_members: list[Member] = Field(default_factory=list, description="list index = old DP rank")
    old_placement: list[list[int]] = Field(
        default_factory=list, description="per old rank, the logical expert held in each physical slot"
    )
    placement: list[list[int]] = Field(description="per new rank, the logical expert of each physical slot")
    placements: list[list[list[int]]] = Field(
        default_factory=list,
        description="per MoE layer, that layer's placement (layer 0 equals `placement`); empty: one layer",
    )
    old_placements: list[list[list[int]]] = Field(
        default_factory=list, description="per MoE layer, the old generation's placement; empty: one layer"
    )
    store: StoreAddress
    store_prefix: str = Field(
        default_factory=lambda: secrets.token_hex(16),
        pattern=r"^[0-9a-f]{0,64}$",
        description="the job's unguessable part of its rendezvous keys' prefix (random per job; the same "
        "request goes to every participant)",
    )
    warmup_policy: WarmupPolicy
    strategy: Strategy = Strategy.background
    transfer_backend: TransferBackend
    leave_policy: LeavePolicy = LeavePolicy.finish
    timeouts: Timeouts = Field(default_factory=Timeouts)

    def role_of(self, engine_id: str) -> Role | None:
        """The engine's part in this job: new generation only, both, old only; None when in neither."""
        in_new = any(m.engine_id == engine_id for m in self.members)
        in_old = any(m.engine_id == engine_id for m in self.old_members)
        if in_new:
            return Role.staying if in_old else Role.joining
        return Role.leaving if in_old else None


def layer_placements(placement: list[list[int]], placements: list[list[list[int]]]) -> list[list[list[int]]]:
    """Every layer's placement from a request or report that carries one (`placement`) or all."""
    if placements:
        return placements
    return [placement] if placement else []


class JobRef(BaseModel):
    job_id: str


class PauseRequest(BaseModel):
    job_id: str
    lease_s: float | None = Field(
        None, gt=0, le=MAX_PAUSE_LEASE_S, description="overrides the prepare request's pause lease"
    )


class ArmRequest(BaseModel):
    """The engine-agreed commit (`POST /v1/reconfig/arm`, after prepare and sync; instead of pause
    and switch). Every member of the old generation is armed for the new one; the serving loop's
    per-step control all-reduce carries it, and the first step boundary at which every member is
    armed is where all of them pause, switch and resume, with no coordinator exchange in between.
    A joiner waits for that boundary (a key on the job's rendezvous store) and switches with them.
    Not all armed within `deadline_s`: each member withdraws its arm, nothing paused, and the job
    fails with `arm-timeout` (downtime 0). The answer's end phase is `committed`."""

    job_id: str
    deadline_s: float = Field(
        gt=0, le=MAX_JOB_TIMEOUT_S, description="how long to wait for every member to arm"
    )
    lease_s: float | None = Field(
        None, gt=0, le=MAX_PAUSE_LEASE_S, description="overrides the prepare request's pause lease"
    )
    max_downtime_ms: int | None = Field(
        None,
        ge=1,
        le=3_600_000,
        description="the downtime budget: after the window's own steps (deferred warm-up), the old "
        "members agree over their old group whether any of them has been stopped longer; if so all "
        "resume the old generation and the job fails `downtime-budget-exceeded`",
    )


class DowntimeOverrun(BaseModel):
    """Which engine overran a job's downtime budget, in which part, by how much."""

    engine_id: str
    part: str = Field(
        description="what took the time: `step boundary`, `warm_up`, `capture_graphs`, `blocking prepare` "
        "or `pause confirmation` (the coordinator's commit), `warm_up`, `capture_graphs` or `window` (the "
        "engine-agreed commit)",
        examples=["warm_up"],
    )
    stopped_ms: float = Field(description="how long the engine had been stopped when the budget was judged")
    budget_ms: int


class AgentError(BaseModel):
    type: str = Field(
        description="machine-readable, kebab-case", examples=["policy-mismatch", "rendezvous-timeout"]
    )
    message: str
    step: str | None = None
    engines: list[str] = Field(default_factory=list, description="the engines the error names, if any")
    overrun: DowntimeOverrun | None = Field(None, description="for `downtime-budget-exceeded`: the overrun")


class PauseInterval(BaseModel):
    """One engine's stopped window. Wall-clock epoch seconds so the coordinator can take a union
    across engines; the durations come from the monotonic clock."""

    paused_at: float
    resumed_at: float | None = None
    pause_ms: float | None = None
    boundary_wait_ms: float = 0.0  # from the pause request to the step boundary
    warmup_ms: float = 0.0  # deferred warm-up inside the window
    blocking_prepare_ms: float = 0.0  # blocking strategy: prepare work inside the window
    capture_ms: float = 0.0  # CUDA graphs captured inside the window (deferred policy, or blocking)
    switch_ms: float = 0.0
    resume_ms: float = 0.0


class GraphCapture(BaseModel):
    """The CUDA graphs one engine captured for a generation's serving step."""

    buckets: list[int] = Field(description="token counts with a graph (a step is padded to the next)")
    graphs: int = Field(description="graphs captured: one per bucket and MoE layer")
    capture_ms: float
    graph_bytes: int = Field(description="device memory the graphs hold (their pool and inputs)")
    in_window: bool = Field(description="captured inside the commit window (else in prepare)")
    kernels: list[str] = Field(
        default_factory=list, description="the expert kernel of each bucket (grouped_mm, padded or direct)"
    )


class DeviceMemory(BaseModel):
    """The device allocator's figures (torch's caching allocator) on a GPU engine."""

    allocated_bytes: int
    reserved_bytes: int


class ReconfigStatus(BaseModel):
    job_id: str
    generation: int
    role: Role
    phase: ReconfigPhase
    step: str | None = Field(None, description="what prepare (or commit) is doing now")
    steps_done: int = 0
    steps_total: int = 0
    bytes_moved: int = Field(0, description="weight bytes staged so far, from any source")
    bytes_total: int = 0
    bytes_loaded: int = Field(0, description="of `bytes_moved`: loaded from the checkpoint")
    bytes_received: int = Field(0, description="of `bytes_moved`: received over the weight channel")
    bytes_resident: int = Field(
        0, description="of `bytes_moved`: copied from weights this engine already held (its old rows)"
    )
    transfer_backend: TransferBackend | None = Field(
        None, description="the weight channel's backend; null when no engine had weights to send"
    )
    warmup_policy: WarmupPolicy
    strategy: Strategy
    synced_value: int | None = Field(None, description="min free KV-cache bytes agreed over the new group")
    graphs: GraphCapture | None = Field(None, description="the new generation's step graphs, once captured")
    pause: PauseInterval | None = None
    error: AgentError | None = None
    updated_at: float


class CleanupRecord(BaseModel):
    job_id: str
    generation: int  # the retired generation
    ok: bool
    error: str | None = None
    duration_ms: float
    finished_at: float
    graph_bytes_released: int = Field(0, description="device memory of the retired step graphs given back")


class CleanupState(StrEnum):
    idle = "idle"
    running = "running"
    failed = "failed"  # an unresolved failure: the next prepare refuses until retry or acknowledge


class CleanupStatus(BaseModel):
    state: CleanupState
    pending_generations: list[int] = Field(default_factory=list)
    failure: CleanupRecord | None = None
    recent: list[CleanupRecord] = Field(default_factory=list, description="newest first, bounded")
