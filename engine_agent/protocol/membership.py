"""The agent as the coordinator sees it: what it reports (`AgentInfo`), how it registers and heartbeats,
the notice peers send when a generation breaks, and the test-only fault switches."""

from __future__ import annotations

from pydantic import BaseModel, Field

from engine_agent.protocol.bounds import PROTOCOL_VERSION
from engine_agent.protocol.engine import AgentState, EngineConfig, Platform
from engine_agent.protocol.reconfig import (
    CleanupStatus,
    DeviceMemory,
    GraphCapture,
    ReconfigStatus,
    StoreAddress,
    TransferBackend,
    WarmupPolicy,
)


class ResidentRows(BaseModel):
    """The expert rows an idle engine still holds from the generation that broke under it: what a
    self-heal shrink re-forms the group from, instead of loading them again."""

    generation: int = Field(description="the broken generation whose weights these are")
    rank: int = Field(description="this engine's rank in that generation")
    placements: list[list[list[int]]] = Field(
        description="that generation's placement, per MoE layer; row `rank` is what this engine holds"
    )


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
    resident: ResidentRows | None = Field(
        None, description="idle engines: the expert rows kept from the generation that broke under them"
    )
    spare_bytes: int = Field(
        0, description="a warm spare (`POST /v1/spare`): the bytes of every expert it holds before it joins"
    )


class SpareHeld(BaseModel):
    """`POST /v1/spare`'s answer: what this engine holds as a warm spare."""

    spare_bytes: int = Field(description="the bytes of every expert of every layer, held before it joins")


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
    slow_steps: int = Field(
        0, ge=0, le=1000, description="the next this many serving iterations each compute `slow_step_s` first"
    )
    slow_step_s: float = Field(
        0.0, ge=0, le=30, description="a slow (not frozen) step: CPU work in the serving thread, this long"
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
    stuck_generation: int | None = Field(
        None,
        ge=1,
        description="the generation one of whose serving collectives this engine has waited on for "
        "`stuck_ms` (past the slow mark, far above a step); sent only while so",
    )
    stuck_ms: float | None = Field(
        None, ge=0, le=86_400_000, description="how long it has waited on that collective (at most a day)"
    )
    stuck_unanswered: list[str] = Field(
        default_factory=list,
        max_length=1024,
        description="members of `stuck_generation` that did not answer this engine's health probe, made "
        "while it waited (the coordinator fences a frozen member on this, issue 39)",
    )
    key_check: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{16}$",
        description="the fingerprint of the agent key it accepts as current (`protocol.key_check`): the "
        "coordinator compares it with its own; null: it needs no key (started insecure)",
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
