"""Deployments: one EP group of engines serving one model, with its scaling limits and policies."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, SecretStr, model_validator
from pydantic import Field as ApiField
from sqlmodel import Field, SQLModel

from app.core.clock import utc_now
from app.core.db import NullableJSON, UTCDateTime
from app.core.shapes import RowShape
from app.deployments.autoscaling import IntentSummary, ScalingBehavior, ScalingBehaviorUpdate
from app.deployments.front_door import FrontDoorPublic
from app.deployments.vllm_settings import VllmConfig, VllmPublic, VllmUpdate
from app.launchers.ray_settings import RaySettings
from engine_agent.protocol import EngineConfig, Strategy

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
# Largest cooldown accepted: a year. Bounded (and finite: JSON has no Infinity) so that it means the same
# on every database and is shown as given.
MAX_COOLDOWN_S = 365 * 86400.0
INT64_MAX = 2**63 - 1


class EngineConfigSpec(EngineConfig):
    """The engine config as the API accepts it: the agent's own model with bounds a real engine can run,
    and no unknown fields (a misspelt one would otherwise be dropped silently)."""

    model_config = ConfigDict(extra="forbid")

    num_logical_experts: int = ApiField(16, ge=1, le=4096, strict=True)
    num_redundant_experts: int = ApiField(0, ge=0, le=4096, strict=True)
    hidden_size: int = ApiField(64, ge=1, le=65536, strict=True)
    intermediate_size: int = ApiField(128, ge=1, le=262144, strict=True)
    top_k: int = ApiField(2, ge=1, le=64, strict=True)
    seed: int = ApiField(0, ge=0, le=INT64_MAX, strict=True)


class WarmupPolicyChoice(StrEnum):
    auto = "auto"  # deferred if any participant runs on ROCm, else eager
    eager = "eager"
    deferred = "deferred"


class LauncherKind(StrEnum):
    local = "local"  # the coordinator starts agent processes on this machine
    static = "static"  # agents register themselves; the pool is what registered
    ray = "ray"  # each engine is a detached actor on a Ray cluster (settings in `ray`)


class DeploymentStatus(StrEnum):
    ready = "ready"
    degraded = "degraded"
    stopped = "stopped"  # its engines stopped on purpose (`epctl up` stopping, `epctl down`)
    adopting = "adopting"  # a starting coordinator asks its members whether they still serve (issue 34)


class OnEngineLoss(StrEnum):
    """What the coordinator does by itself when a member engine is lost (`liveness.heal`)."""

    shrink = "shrink"  # a new generation on the survivors
    replace = "replace"  # type: ignore[assignment]  # shrink, then launch engines and grow back
    none = "none"  # only report it (degraded); the operator acts


def effective_on_engine_loss(on_engine_loss: str | None, launcher: str) -> OnEngineLoss:
    """The setting, or its default: `replace` where the launcher can start engines, else `shrink`."""
    if on_engine_loss:
        return OnEngineLoss(on_engine_loss)
    return OnEngineLoss.shrink if launcher == "static" else OnEngineLoss.replace


class EngineBackend(StrEnum):
    """What the coordinator drives: its own agents (`reference`), or a vLLM API server's own elastic EP
    endpoint (`vllm`)."""

    reference = "reference"
    vllm = "vllm"


class Condition(BaseModel):
    """Something an operator should know about a deployment that is not a status: it may be `ready`."""

    type: str = ApiField(description="kebab-case, e.g. engine-unreachable-from-coordinator")
    engine_id: str | None = None
    since: datetime
    message: str


class StatusDetail(BaseModel):
    """Why a deployment is degraded (or stopped), and what to do about it."""

    reason: str = ApiField(description="kebab-case, e.g. engine-unreachable, engine-stuck-scaling")
    message: str
    hint: str | None = ApiField(None, description="the remediation, e.g. restart the engine")
    since: datetime | None = None
    job_id: str | None = ApiField(None, description="the job that found it, if one did")


# The downtime budget's bounds (`max_downtime_ms`, deployment and request): 1 ms to one hour.
MAX_DOWNTIME_BUDGET_MS = 3_600_000
MAX_SPARES = 16
SPARES_DESCRIPTION = (
    "warm spares (issue 38): engines kept launched and registered beyond the size, each holding every "
    "expert's weights, never members until needed: self-heal replaces a lost engine with one (a new "
    "spare is launched in the background) and a grow takes them first. Reference backend with a "
    "launcher that starts engines (local, ray) only; 0: none"
)
AUTOSCALE_BEHAVIOR_DESCRIPTION = (
    "how autoscaler intents move the deployment (Kubernetes HPA's `behavior`): per direction a "
    "stabilization window (scale_down 300 s, scale_up 0 s by default) and an optional max_step per period_s"
)
AUTOSCALE_PAUSED_DESCRIPTION = (
    "stop autoscaler-initiated jobs (KEDA's autoscaling.keda.sh/paused); operator jobs, /scale writes and "
    "self-healing still run, and intents are still recorded"
)
# A launch's readiness timeout set per deployment (`launch_timeout_s`): 1 s to one hour.
LaunchTimeout = Annotated[float, ApiField(ge=1, le=3600.0, allow_inf_nan=False, strict=True)]
LAUNCH_TIMEOUT_DESCRIPTION = (
    "how long a launch of this deployment's engines waits for them to be ready (seconds); an engine whose "
    "process exits fails the launch at once. Null: adaptive (`app.launchers.readiness`), the "
    "coordinator's launch deadline raised by the launches it saw and stretched with the load"
)
DOWNTIME_BUDGET_DESCRIPTION = (
    "the downtime budget: a commit window that would run longer ends on the old generation "
    "(rolled_back, downtime-budget-exceeded); null: none"
)


class Deployment(SQLModel, table=True):
    __tablename__ = "deployments"

    id: str = Field(primary_key=True, max_length=40)
    name: str = Field(max_length=63, sa_column_kwargs={"unique": True})
    engine_config: dict[str, Any] = Field(sa_type=sa.JSON)
    min_dp_size: int
    max_dp_size: int
    warmup_policy: str = Field(sa_type=sa.String(16))
    strategy: str = Field(sa_type=sa.String(16))
    launcher: str = Field(sa_type=sa.String(16))
    # The launcher's own settings (`launcher: ray`: `RaySettings`); NULL for local and static.
    launcher_options: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    current_dp_size: int = 0
    generation: int = 0
    status: str = Field(default=DeploymentStatus.ready.value, sa_type=sa.String(16))
    autoscale_cooldown_s: float = 60.0
    backend: str = Field(
        default=EngineBackend.reference.value,
        sa_type=sa.String(16),
        sa_column_kwargs={"server_default": EngineBackend.reference.value},
    )
    backend_config: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    # e.g. vLLM's API key, sealed (`app.core.sealing`; a value written before issue 32 is bare).
    backend_secret: str | None = Field(default=None, max_length=1024, description="e.g. vLLM's API key")
    status_detail: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    # NULL: the launcher's default (`effective_on_engine_loss`).
    on_engine_loss: str | None = Field(default=None, sa_type=sa.String(16))
    # Self-healing's memory (app/backends/reference/liveness/heal.py): the engines written off since the
    # deployment was last whole, and (`replace`) the size to grow back to.
    heal_lost: str | None = Field(default=None, max_length=1000)
    heal_target_dp_size: int | None = None
    # Warm spares to keep beyond the size (`app.backends.reference.spares`).
    spares: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # When the loss happened, as far as the coordinator can tell (the lost engine's last heartbeat, or
    # when its group was found broken): the recovery jobs' figures count from it.
    heal_loss_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The size it had when its engines were stopped (`stopped` status): what a restart brings back.
    stopped_dp_size: int | None = None
    max_downtime_ms: int | None = Field(default=None, description="the downtime budget; NULL: none")
    launch_timeout_s: float | None = Field(default=None, description="launch readiness; NULL: adaptive")
    # The serving generation's coverage (`Coverage.record` with its generation and since when), written
    # by the switch that made the generation; `conditions` (coverage-at-risk) are read from it.
    coverage: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    # Autoscaling (`app.scale`): HPA-style behaviour (NULL: the defaults), KEDA-style pause, and the
    # counter in the `/scale` resourceVersion, bumped by every accepted write of the Scale.
    autoscale_behavior: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    autoscale_paused: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})
    scale_version: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # The agent plane's key (`app.deployments.agent_keys`), sealed (`app.core.sealing`): the
    # coordinator sends it on every agent call, so it is kept sealed rather than hashed. The previous
    # one is still sent (and accepted by agents) until `agent_key_previous_until`.
    agent_key: str | None = Field(default=None, max_length=1024)
    agent_key_previous: str | None = Field(default=None, max_length=1024)
    agent_key_previous_until: datetime | None = Field(default=None, sa_type=UTCDateTime)
    agent_key_shown_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


class DeploymentLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_dp_size: int = ApiField(1, ge=1, le=1024, strict=True)
    max_dp_size: int = ApiField(8, ge=1, le=1024, strict=True)

    @model_validator(mode="after")
    def _min_not_above_max(self) -> DeploymentLimits:
        if self.min_dp_size > self.max_dp_size:
            raise ValueError(f"min_dp_size ({self.min_dp_size}) exceeds max_dp_size ({self.max_dp_size})")
        return self


def _check_launcher_settings(launcher: LauncherKind | str, ray: RaySettings | None) -> None:
    if ray is not None and launcher != LauncherKind.ray:
        raise ValueError(f"`ray` settings apply to launcher ray only, not {LauncherKind(launcher).value}")


class DeploymentCreate(DeploymentLimits):
    name: str = ApiField(pattern=NAME_PATTERN, description="a DNS-label style slug, unique")
    backend: EngineBackend = ApiField(
        EngineBackend.reference, description="reference: epctl's agents; vllm: a vLLM API server"
    )
    engine: EngineConfigSpec = ApiField(
        default_factory=EngineConfigSpec, description="the reference engine's layout"
    )
    vllm: VllmConfig | None = ApiField(None, description="required with backend vllm")
    launcher: LauncherKind = LauncherKind.local
    ray: RaySettings | None = ApiField(
        None, description="launcher ray: the cluster and each engine's resources (default settings if absent)"
    )
    warmup_policy: WarmupPolicyChoice = WarmupPolicyChoice.auto
    strategy: Strategy = Strategy.background
    autoscale_cooldown_s: float = ApiField(60.0, ge=0, le=MAX_COOLDOWN_S, allow_inf_nan=False, strict=True)
    on_engine_loss: OnEngineLoss | None = ApiField(
        None,
        description="when a member engine is lost: shrink (a new generation on the survivors), replace "
        "(shrink, then launch engines and grow back) or none (report only); default replace where the "
        "launcher can start engines (local, ray), else shrink",
    )
    max_downtime_ms: int | None = ApiField(
        None, ge=1, le=MAX_DOWNTIME_BUDGET_MS, strict=True, description=DOWNTIME_BUDGET_DESCRIPTION
    )
    spares: int = ApiField(0, ge=0, le=MAX_SPARES, strict=True, description=SPARES_DESCRIPTION)
    launch_timeout_s: LaunchTimeout | None = ApiField(None, description=LAUNCH_TIMEOUT_DESCRIPTION)
    autoscale_behavior: ScalingBehavior = ApiField(
        default_factory=ScalingBehavior, description=AUTOSCALE_BEHAVIOR_DESCRIPTION
    )
    autoscale_paused: bool = ApiField(False, strict=True, description=AUTOSCALE_PAUSED_DESCRIPTION)
    agent_key: SecretStr | None = ApiField(
        None,
        min_length=32,
        max_length=256,
        description="the agent plane's key, write-only (never shown back): for static agents already "
        "given one; default: the coordinator makes one (`POST .../agent-key` shows it once)",
    )

    @model_validator(mode="after")
    def _backend_settings_match(self) -> DeploymentCreate:
        if self.backend is EngineBackend.vllm:
            if self.vllm is None:
                raise ValueError("backend vllm needs `vllm` settings (at least `url`, or `model` to launch)")
            if self.launcher is LauncherKind.static and not self.vllm.url:
                raise ValueError("a vllm deployment with launcher static needs `vllm.url` (the API server)")
            if self.launcher is LauncherKind.local and not self.vllm.model:
                raise ValueError("a vllm deployment with launcher local needs `vllm.model` to serve")
        elif self.vllm is not None:
            raise ValueError("`vllm` settings are only for backend vllm")
        return self

    @model_validator(mode="after")
    def _launcher_settings(self) -> DeploymentCreate:
        _check_launcher_settings(self.launcher, self.ray)
        if self.spares:
            problem = spares_problem(self.backend, self.launcher)
            if problem:
                raise ValueError(problem)
        if self.launcher == LauncherKind.ray and self.ray is None:
            self.ray = RaySettings()
        return self

    def launcher_options(self) -> dict[str, Any] | None:
        return self.ray.model_dump(mode="json") if self.ray is not None else None


class DeploymentUpdate(BaseModel):
    """Only the fields given change. Limits are checked against each other after merging."""

    model_config = ConfigDict(extra="forbid")

    min_dp_size: int | None = ApiField(None, ge=1, le=1024, strict=True)
    max_dp_size: int | None = ApiField(None, ge=1, le=1024, strict=True)
    warmup_policy: WarmupPolicyChoice | None = None
    strategy: Strategy | None = None
    autoscale_cooldown_s: float | None = ApiField(
        None, ge=0, le=MAX_COOLDOWN_S, allow_inf_nan=False, strict=True
    )
    on_engine_loss: OnEngineLoss | None = None
    max_downtime_ms: int | None = ApiField(
        None,
        ge=1,
        le=MAX_DOWNTIME_BUDGET_MS,
        strict=True,
        description="the downtime budget (an explicit null turns it off)",
    )
    autoscale_behavior: ScalingBehaviorUpdate | None = ApiField(
        None, description="only the fields given change; " + AUTOSCALE_BEHAVIOR_DESCRIPTION
    )
    autoscale_paused: bool | None = ApiField(None, strict=True, description=AUTOSCALE_PAUSED_DESCRIPTION)
    spares: int | None = ApiField(None, ge=0, le=MAX_SPARES, strict=True, description=SPARES_DESCRIPTION)
    launch_timeout_s: LaunchTimeout | None = ApiField(
        None,
        description="an explicit null makes it adaptive again; " + LAUNCH_TIMEOUT_DESCRIPTION,
    )
    vllm: VllmUpdate | None = ApiField(None, description="backend vllm only")
    ray: RaySettings | None = ApiField(
        None,
        description="launcher ray: replaces the Ray settings (used by the next launch); the address and "
        "namespace change only while the deployment has no engines",
    )


class DesiredSize(BaseModel):
    """Where the autoscalers' standing intents take the deployment next, and what holds it back
    (`app.scale.desired`; the rule is in docs/operations/webhooks-and-autoscalers.md)."""

    dp_size: int | None = ApiField(
        None,
        description="the size the next autoscaler move goes to (a pending intent's, clamped); null: none",
    )
    intent_id: str | None = ApiField(None, description="the pending intent that move acts on")
    source: str | None = ApiField(None, description="alertmanager, generic or scale-subresource")
    requester: str | None = None
    reason: str | None = None
    requested_at: datetime | None = None
    pending: bool = ApiField(False, description="an intent waits to be acted on")
    blocked_by: str | None = ApiField(
        None,
        description="why it waits: active-job, cooldown, paused, stabilization-window, higher-intent, "
        "max-step or job-refused",
    )
    next_scale_at: datetime | None = ApiField(
        None, description="when that ends, if known (null: now, or when something else changes)"
    )
    standing: list[IntentSummary] = ApiField(
        default_factory=list, description="the intents that stand now (pending or acted on), newest first"
    )
    standing_target: int | None = ApiField(
        None,
        description="a partial grow's target (issue 38): a job reached only part of it; a later job "
        "(`requested_by: standing-target`) completes it when capacity appears. Null: none stands",
    )
    standing_target_job_id: str | None = ApiField(None, description="the partial job that set it")


class DeploymentPublic(RowShape):
    id: str
    name: str
    backend: EngineBackend
    engine: EngineConfig
    vllm: VllmPublic | None = None
    launcher: LauncherKind
    ray: RaySettings | None = None
    min_dp_size: int
    max_dp_size: int
    warmup_policy: WarmupPolicyChoice
    strategy: Strategy
    autoscale_cooldown_s: float
    max_downtime_ms: int | None = None
    autoscale_behavior: ScalingBehavior
    autoscale_paused: bool
    current_dp_size: int
    generation: int
    status: DeploymentStatus
    status_detail: StatusDetail | None = None
    stopped_dp_size: int | None = ApiField(
        None,
        description="while `stopped`: the size it had when its engines were stopped (what `epctl up` brings "
        "back on the same data directory)",
    )
    on_engine_loss: OnEngineLoss = ApiField(description="in effect (the setting, or the launcher's default)")
    spares: int = ApiField(0, description="warm spares to keep (the setting)")
    launch_timeout_s: float | None = ApiField(None, description=LAUNCH_TIMEOUT_DESCRIPTION)
    spare_engines: list[str] = ApiField(
        default_factory=list,
        description="the engines kept as warm spares now (idle, registered, holding every expert), oldest "
        "first; fewer than `spares` while a new one is launched",
    )
    active_job_id: str | None = None
    desired: DesiredSize = ApiField(default_factory=DesiredSize)
    coverage: dict[str, Any] | None = ApiField(
        None,
        description="the serving generation's coverage, as its job recorded it (`covered`, `at_risk`, "
        "`at_risk_domain`, where the single replicas sit), with `generation` and `since`; null before a "
        "reference-engine job formed a generation",
    )
    conditions: list[Condition] = ApiField(
        default_factory=list,
        description="e.g. `engine-unreachable-from-coordinator`: a member the coordinator cannot hear while "
        "its group steps (no self-heal; jobs refused until it is heard again, unless forced); "
        "`coverage-at-risk`: the next single loss of an engine (or of a failure domain) would leave an "
        "expert with no replica (only where redundant experts are configured)",
    )
    front_door: FrontDoorPublic | None = ApiField(
        None,
        description="where clients send requests (`url`) and what keeps it in step with the rank set "
        "(`keeper`; `GET .../endpoints` is the feed it follows); null: no front door",
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def derived(cls, row: Deployment) -> dict[str, Any]:
        vllm = (
            VllmPublic.from_stored(row.backend_config, api_key_set=bool(row.backend_secret))
            if row.backend == EngineBackend.vllm
            else None
        )
        return {
            "engine": row.engine_config,
            "vllm": vllm,
            "ray": ray_settings_of(row),
            "status_detail": row.status_detail or None,
            "on_engine_loss": effective_on_engine_loss(row.on_engine_loss, row.launcher),
            "autoscale_behavior": ScalingBehavior.stored(row.autoscale_behavior),
        }


class DeploymentList(BaseModel):
    data: list[DeploymentPublic]
    count: int = ApiField(description="every deployment, over all pages")
    next_cursor: str | None = ApiField(
        None, description="pass as `cursor` for the next page; none: last page"
    )


def spares_problem(backend: EngineBackend | str, launcher: LauncherKind | str) -> str | None:
    """Why a deployment of this backend and launcher cannot keep warm spares (None: it can)."""
    if backend != EngineBackend.reference:
        return f"warm spares are for backend reference only, not {EngineBackend(backend).value}"
    if launcher == LauncherKind.static:
        return "warm spares need a launcher that starts engines (local, ray), not static"
    return None


def ray_settings_of(row: Deployment) -> RaySettings | None:
    """The stored Ray settings of a `launcher: ray` deployment (None for other launchers)."""
    if row.launcher != LauncherKind.ray.value:
        return None
    return RaySettings.model_validate(row.launcher_options or {})
