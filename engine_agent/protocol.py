"""The coordinator <-> agent protocol: request and response models shared by both sides.

This module must stay importable without torch: the coordinator imports it.

Flow of one reconfiguration, as the coordinator drives it (every POST answers 202 at once with the
agent's `ReconfigStatus`; the caller polls `GET /v1/reconfig` until the phase it waits for):

    background strategy: prepare -> sync -> pause -> switch          (cleanup runs after switch)
    blocking strategy:   prepare -> pause -> sync -> switch          (prepare's work runs inside pause)

`prepare` goes to every participant (old members and new members). `pause` is the first half of the
two-step commit: every member of the old generation stops at the same step boundary (the serving
loop agrees on it through its per-step control all-reduce), deferred warm-up runs, and the agent
reports `paused`. Only when all participants are `paused` does the coordinator send `switch`, which
swaps groups and expert map together and resumes serving. `resume` (or `abort`) instead of `switch`
puts a paused agent back on its old generation. A paused agent that hears nothing within
`pause_lease_s` resumes on its old generation by itself.

Bounded long-poll (so one phase costs one HTTP exchange per engine): `GET /v1/reconfig?job_id=J&
until=paused,committed&wait_s=S` answers as soon as job J is in one of `until` or in a terminal phase
(or reports an error), else after S seconds with the current status. Every action POST takes
`?wait_s=S` too (and an optional `until`, default the action's own end phase: prepare -> prepared,
sync -> synced, pause -> paused, switch -> committed, resume -> resumed, abort -> aborted), so one call
carries "do it and tell me when done". S defaults to 0 (answer at once) and is capped at `MAX_WAIT_S`.
An agent that supports this marks its reconfig answers with the `LONG_POLL_HEADER` header (its value is
the cap); a caller that does not see it falls back to polling.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

PROTOCOL_VERSION = 1

MAX_WAIT_S = 30.0  # the longest one long-poll (or action POST with wait_s) is held open
LONG_POLL_HEADER = "Epctl-Wait-Max-S"  # on reconfig answers of an agent that supports wait_s


class Platform(StrEnum):
    cpu = "cpu"
    cuda = "cuda"
    rocm = "rocm"


class WarmupPolicy(StrEnum):
    eager = "eager"  # first collective on the new groups during prepare
    deferred = "deferred"  # first collective inside the paused window (ROCm/RCCL safety)


class Strategy(StrEnum):
    background = "background"  # prepare while serving; commit only switches
    blocking = "blocking"  # the old way: all of prepare inside the paused window


class TransferBackend(StrEnum):
    nixl = "nixl"  # one-sided READs through NIXL/UCX, as production engines do
    gloo = "gloo"  # send/recv over a transfer process group: the fallback


class LeavePolicy(StrEnum):
    finish = "finish"  # a leaving engine stops admitting at prepare and drains before it pauses
    abort = "abort"  # a leaving engine fails its queued requests at switch


class AgentState(StrEnum):
    idle = "idle"  # in no generation: a joiner before its first switch, or an engine that left
    serving = "serving"
    paused = "paused"


class Role(StrEnum):
    joining = "joining"  # in the new generation only
    staying = "staying"  # in both
    leaving = "leaving"  # in the old generation only


class ReconfigPhase(StrEnum):
    preparing = "preparing"
    prepared = "prepared"
    syncing = "syncing"
    synced = "synced"
    pausing = "pausing"
    paused = "paused"
    switching = "switching"
    committed = "committed"  # switched and serving the new generation (or idle, for a leaver)
    resuming = "resuming"
    resumed = "resumed"  # rolled back after a pause: serving the old generation again
    aborting = "aborting"
    aborted = "aborted"
    failed = "failed"


TERMINAL_PHASES = frozenset(
    {ReconfigPhase.committed, ReconfigPhase.resumed, ReconfigPhase.aborted, ReconfigPhase.failed}
)


class EngineConfig(BaseModel):
    """The reference MoE layer. Every engine of one deployment runs the same config."""

    num_logical_experts: int = Field(16, ge=1)
    num_redundant_experts: int = Field(0, ge=0)
    hidden_size: int = Field(64, ge=1)
    intermediate_size: int = Field(128, ge=1)
    top_k: int = Field(2, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = 0


class Member(BaseModel):
    engine_id: str
    url: str


class StoreAddress(BaseModel):
    """A rendezvous store (torch TCPStore) hosted by one agent; generations use their own prefix."""

    host: str
    port: int = Field(ge=1, le=65535)


class Timeouts(BaseModel):
    rendezvous_s: float = Field(30.0, gt=0)
    collective_s: float = Field(30.0, gt=0)
    transfer_s: float = Field(120.0, gt=0)
    pause_lease_s: float = Field(10.0, gt=0)


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
    store: StoreAddress
    warmup_policy: WarmupPolicy
    strategy: Strategy = Strategy.background
    transfer_backend: TransferBackend
    leave_policy: LeavePolicy = LeavePolicy.finish
    timeouts: Timeouts = Field(default_factory=Timeouts)


class JobRef(BaseModel):
    job_id: str


class PauseRequest(BaseModel):
    job_id: str
    lease_s: float | None = Field(None, gt=0, description="overrides the prepare request's pause lease")


class AgentError(BaseModel):
    type: str  # machine-readable, e.g. "policy_mismatch", "rendezvous_timeout", "cleanup_failed"
    message: str
    step: str | None = None
    engines: list[str] = Field(default_factory=list, description="the engines the error names, if any")


class PauseInterval(BaseModel):
    """One engine's stopped window. Wall-clock epoch seconds so the coordinator can take a union
    across engines; the durations come from the monotonic clock."""

    paused_at: float
    resumed_at: float | None = None
    pause_ms: float | None = None
    boundary_wait_ms: float = 0.0  # from the pause request to the step boundary
    warmup_ms: float = 0.0  # deferred warm-up inside the window
    blocking_prepare_ms: float = 0.0  # blocking strategy: prepare work inside the window
    switch_ms: float = 0.0
    resume_ms: float = 0.0


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
    transfer_backend: TransferBackend | None = None
    warmup_policy: WarmupPolicy
    strategy: Strategy
    synced_value: int | None = Field(None, description="min free KV-cache bytes agreed over the new group")
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
    engine: EngineConfig
    store: StoreAddress
    transfer_backends: list[TransferBackend]
    serving_steps: int
    requests_served: int
    queued_requests: int = Field(0, description="requests waiting for a step (they stall while paused)")
    expert_load: list[int] = Field(default_factory=list, description="tokens routed per logical expert")
    free_kv_bytes: int
    reconfig: ReconfigStatus | None = None
    cleanup: CleanupStatus


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


class FaultInjection(BaseModel):
    """Test-only switches, accepted only by an agent started with --enable-fault-injection."""

    fail_next_cleanup: bool = False
    fail_prepare_at_step: str | None = None
    hang_prepare_at_step: str | None = Field(
        None, description="stop at this prepare step until aborted or released (release_hang)"
    )
    release_hang: bool = Field(False, description="let a prepare held by hang_prepare_at_step go on")
    fail_next_switch: bool = False
    warmup_policy_override: WarmupPolicy | None = Field(
        None, description="pretend the job said this policy (to show the mismatch check)"
    )


class AgentHeartbeat(BaseModel):
    """What an agent sends to the coordinator's `POST /v1/engines/{engine_id}/heartbeat`."""

    state: AgentState
    generation: int
    rank: int | None = None
    world_size: int = 0
