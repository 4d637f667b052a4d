"""The coordinator <-> agent protocol: request and response models shared by both sides.

This module must stay importable without torch: the coordinator imports it.

Flow of one reconfiguration, as the coordinator drives it (every POST answers 202 with the agent's
`ReconfigStatus`, at once or, given `wait_s`, once the step's own phase is reached; see the bounded
long-poll below):

    background strategy: prepare -> sync -> pause -> switch          (cleanup runs after switch)
    blocking strategy:   prepare -> pause -> sync -> switch          (prepare's work runs inside pause)

(The table of calls and phases, which call moves an agent from which phase to which and in what order,
is `engine_agent.choreography`: re-exported here, so that both sides read it through the protocol.)

`prepare` goes to every participant (old members and new members). `pause` is the first half of the
two-step commit: every member of the old generation stops at the same step boundary (the serving
loop agrees on it through its per-step control all-reduce), deferred warm-up runs, and the agent
reports `paused`. Only when all participants are `paused` does the coordinator send `switch`, which
swaps groups and expert map together and resumes serving. `resume` (or `abort`) instead of `switch`
puts a paused agent back on its old generation. A paused agent that hears nothing within
`pause_lease_s` resumes on its old generation by itself.

The engine-agreed commit (`POST /v1/reconfig/arm`, `ArmRequest`, instead of pause and switch): after
sync every participant is armed for the new generation; the serving loops agree on the first step
boundary at which every member of the old generation is armed and pause, switch and resume there with
no coordinator exchange (phases: armed -> paused -> switching -> committed).

Bounded long-poll (so one phase costs one HTTP exchange per engine): `GET /v1/reconfig?job_id=J&
until=paused,committed&wait_s=S` answers as soon as job J is in one of `until` or in a terminal phase
(or reports an error), else after S seconds with the current status. Every action POST takes
`?wait_s=S` too (and an optional `until`, default the action's own end phase: prepare -> prepared,
sync -> synced, pause -> paused, switch -> committed, resume -> resumed, abort -> aborted), so one call
carries "do it and tell me when done". S defaults to 0 (answer at once) and is capped at `MAX_WAIT_S`.
An agent marks its reconfig answers with the `LONG_POLL_HEADER` header (its value is the cap); a caller
that does not see it (an agent older than the long-poll) falls back to polling.

Every machine-readable code (`AgentError.type`, a problem's `code`) is kebab-case: see
`engine_agent.problems`.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from enum import StrEnum
from typing import Literal, Self

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from engine_agent.choreography import ACCEPTS as ACCEPTS
from engine_agent.choreography import ARMED_ONWARD as ARMED_ONWARD
from engine_agent.choreography import CALLS as CALLS
from engine_agent.choreography import COMMITTING as COMMITTING
from engine_agent.choreography import ENGINES_FINISHING as ENGINES_FINISHING
from engine_agent.choreography import MOVES as MOVES
from engine_agent.choreography import RECOVERING_PHASES, TERMINAL_PHASES, ReconfigPhase, Strategy
from engine_agent.choreography import ROLLED_BACK as ROLLED_BACK
from engine_agent.choreography import STEPS_COMPLETE as STEPS_COMPLETE
from engine_agent.choreography import STOPPED as STOPPED
from engine_agent.choreography import CommitMode as CommitMode
from engine_agent.choreography import Move as Move
from engine_agent.choreography import Operation as Operation
from engine_agent.choreography import calls_for as calls_for

PROTOCOL_VERSION = 1

MAX_WAIT_S = 30.0  # the longest one long-poll (or action POST with wait_s) is held open
# Bounds of the agent's own inputs (an agent refuses more with 422, as the coordinator does for its
# fields): a pause lease is what a caller can hold serving stopped for; deadlines a job can set.
MAX_PAUSE_LEASE_S = 300.0
MAX_JOB_TIMEOUT_S = 3600.0
MAX_SERVING_COLLECTIVE_S = 600.0
LONG_POLL_HEADER = "Epctl-Wait-Max-S"  # on reconfig answers of an agent that supports wait_s


class Platform(StrEnum):
    cpu = "cpu"
    cuda = "cuda"
    rocm = "rocm"


class WarmupPolicy(StrEnum):
    eager = "eager"  # first collective on the new groups during prepare
    deferred = "deferred"  # first collective inside the paused window (ROCm/RCCL safety)


class TransferBackend(StrEnum):
    nixl = "nixl"  # one-sided READs through NIXL/UCX, as production engines do
    gloo = "gloo"  # send/recv over a transfer process group: the fallback


class LeavePolicy(StrEnum):
    finish = "finish"  # a leaving engine stops admitting at prepare and drains before it pauses


class AgentState(StrEnum):
    idle = "idle"  # in no generation: a joiner before its first switch, or an engine that left
    serving = "serving"
    paused = "paused"


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


# As vLLM's capture sizes: powers of two up to twice the most tokens one step takes from the queue.
DEFAULT_GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
MAX_GRAPH_BUCKET = 4096  # the most tokens one request may bring


def graph_buckets(buckets: list[int]) -> list[int]:
    """Graph buckets checked and in order (sorted, distinct)."""
    if not buckets or any(not 1 <= b <= MAX_GRAPH_BUCKET for b in buckets):
        raise ValueError(f"graph buckets must be 1..{MAX_GRAPH_BUCKET} tokens each, at least one")
    return sorted(set(buckets))


class EngineConfig(BaseModel):
    """The reference MoE layer. Every engine of one deployment runs the same config."""

    num_logical_experts: int = Field(16, ge=1)
    num_redundant_experts: int = Field(0, ge=0)
    hidden_size: int = Field(64, ge=1)
    intermediate_size: int = Field(128, ge=1)
    top_k: int = Field(2, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = 0
    num_moe_layers: int = Field(1, ge=1, le=256, description="MoE layers, each with its own experts")
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="capture the serving step as CUDA graphs, one per token-count bucket (auto: on a "
        "CUDA/ROCm device with the batched step; on: refuse to start where it cannot)",
    )
    cuda_graph_buckets: list[int] = Field(
        default_factory=lambda: list(DEFAULT_GRAPH_BUCKETS),
        min_length=1,
        max_length=32,
        description="the token counts a graph is captured for (a step is padded to the next one; "
        "past the largest it runs eagerly)",
    )

    @field_validator("cuda_graph_buckets")
    @classmethod
    def _buckets_sorted(cls, buckets: list[int]) -> list[int]:
        return graph_buckets(buckets)

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> Self:
        # A token is routed to top_k distinct logical experts: there must be that many.
        if self.top_k > self.num_logical_experts:
            raise ValueError(
                f"top_k ({self.top_k}) must not exceed num_logical_experts ({self.num_logical_experts})"
            )
        return self

    @property
    def expert_nbytes(self) -> int:
        """One logical expert's packed weights (gate, up, down) in one layer, in bytes."""
        return 3 * self.intermediate_size * self.hidden_size * (4 if self.dtype == "float32" else 2)


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
        default_factory=list, description="the expert kernel of each bucket (grouped_mm or padded)"
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
    bytes_moved: int = 0
    bytes_total: int = 0
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


class AgentInfo(BaseModel):
    protocol_version: int = PROTOCOL_VERSION
    engine_id: str
    url: str
    pid: int
    platform: Platform
    device: str
    state: AgentState
    generation: int
    rank: int | None
    world_size: int
    warmup_policy: WarmupPolicy | None
    placement: list[list[int]] = Field(default_factory=list, description="the active generation's")
    placements: list[list[list[int]]] = Field(
        default_factory=list, description="the active generation's, per MoE layer (layer 0 = `placement`)"
    )
    engine: EngineConfig
    store: StoreAddress
    transfer_backends: list[TransferBackend]
    serving_steps: int
    graph_steps: int = Field(0, description="serving steps that replayed captured CUDA graphs")
    requests_served: int
    queued_requests: int = Field(0, description="requests waiting for a step (they stall while paused)")
    expert_load: list[int] = Field(
        default_factory=list, description="tokens routed per logical expert, summed over the MoE layers"
    )
    layer_expert_load: list[list[int]] = Field(
        default_factory=list, description="tokens routed per logical expert, per MoE layer"
    )
    free_kv_bytes: int
    step_ms: dict[str, float] | None = Field(
        None, description="duration of the recent real serving steps: p50, p99 (ms) and how many steps"
    )
    reconfig: ReconfigStatus | None = None
    cleanup: CleanupStatus
    cuda_graphs: GraphCapture | None = Field(None, description="the serving generation's step graphs")
    device_memory: DeviceMemory | None = Field(None, description="GPU engines: the device allocator")


class InferRequest(BaseModel):
    tokens: list[list[float]] = Field(min_length=1, description="token vectors of hidden_size")


class InferResponse(BaseModel):
    outputs: list[list[float]]
    generation: int
    rank: int
    step: int


class AgentRegistration(BaseModel):
    """What an agent sends to the coordinator's `POST /v1/engines` when it announces itself."""

    engine_id: str
    deployment: str
    url: str
    platform: Platform
    device: str
    engine: EngineConfig
    generation: int = 0
    rank: int | None = None
    pid: int | None = Field(None, description="the agent's process, so a coordinator on its host can stop it")
    data_host: str | None = Field(None, description="its data address (rendezvous, collectives, weights)")
    hostname: str | None = Field(None, description="the host the agent runs on")


class FaultInjection(BaseModel):
    """Test-only switches, accepted only by an agent started with --enable-fault-injection."""

    fail_next_cleanup: bool = False
    fail_prepare_at_step: str | None = None
    hang_prepare_at_step: str | None = Field(
        None, description="stop at this prepare step until aborted or released (release_hang)"
    )
    release_hang: bool = Field(False, description="let a prepare held by hang_prepare_at_step go on")
    fail_next_switch: bool = False
    hold_arm: bool = Field(
        False, description="accept the next arm but never arm the engine (the boundary never comes)"
    )
    warmup_policy_override: WarmupPolicy | None = Field(
        None, description="pretend the job said this policy (to show the mismatch check)"
    )


class AgentHeartbeat(BaseModel):
    """What an agent sends to the coordinator's `POST /v1/engines/{engine_id}/heartbeat`: the engine's
    own truth, which the coordinator's view of the deployment follows (`app.deployments.health`)."""

    state: AgentState
    generation: int
    rank: int | None = None
    world_size: int = 0
    serving_steps: int = Field(0, ge=0, description="real serving steps so far (the last step's number)")
    group_error: str | None = Field(
        None,
        max_length=2000,
        description="why the engine left its generation's group, while it serves none (a peer died)",
    )
    broken_generation: int | None = Field(
        None, ge=1, description="the generation whose group broke under this engine, while it serves none"
    )
    unresponsive_peers: list[str] = Field(
        default_factory=list,
        max_length=1024,
        description="members of `broken_generation` that did not answer this engine's health probe when "
        "the group broke (the coordinator fences the one every survivor names)",
    )
    broken_last_step_at: float | None = Field(
        None,
        ge=0,
        description="when `broken_generation` last stepped on this engine (epoch seconds, its clock): every "
        "member stepped together, so the group's clients were served until then (the survivors' record of "
        "the loss, also for a loss while no coordinator ran)",
    )
    group_steps: int = Field(
        0, ge=0, description="lock-step iterations served so far (every one a collective with every member)"
    )
    data_unreachable: list[str] = Field(
        default_factory=list,
        max_length=1024,
        description="peers (of its current generation, or the last it was in) whose data address did not "
        "accept a connection from this engine: the data network's view from here",
    )


class GenerationBroken(BaseModel):
    """A member's notice to its peers (`POST /v1/generation/broken`): the group of `generation` broke
    (a collective failed or ran past its deadline), so each gives it up at once instead of waiting out
    a collective that can no longer complete."""

    generation: int = Field(ge=1)
    reason: str = Field("", max_length=2000)
    reporter: str | None = Field(None, max_length=200, description="the engine that found it broken")


class GenerationBrokenAnswer(BaseModel):
    abandoned: bool = Field(description="false when this engine serves another generation (or none)")


MAX_KEY_OVERLAP_S = 7 * 86400.0


class AgentKeyRotation(BaseModel):
    """The coordinator's push of a rotated agent key (`POST /v1/agent-key`)."""

    key: SecretStr = Field(min_length=16, max_length=256, description="the new agent key")
    overlap_s: float = Field(
        gt=0, le=MAX_KEY_OVERLAP_S, description="how long the key current until now stays accepted"
    )


class AgentKeyRotated(BaseModel):
    overlap_s: float
