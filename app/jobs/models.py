"""Reconfiguration jobs, their append-only event log, and Idempotency-Key records."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic import Field as ApiField
from sqlmodel import Field, SQLModel

from app.api.params import ENGINE_ID_PATTERN, REF_PATTERN
from app.core.clock import utc_now
from app.core.db import NullableJSON, UTCDateTime
from app.core.shapes import RowShape
from app.deployments.models import MAX_DOWNTIME_BUDGET_MS, WarmupPolicyChoice
from app.jobs.states import TERMINAL_STATES, JobState
from engine_agent.protocol import CommitMode, DowntimeOverrun, Strategy, WarmupPolicy

JOB_ID_PREFIX = "rcfg"

# One active (non-terminal) job per deployment, enforced by the database on SQLite and Postgres alike.
_ACTIVE_PREDICATE = sa.text(
    "state NOT IN (" + ", ".join(f"'{state.value}'" for state in sorted(TERMINAL_STATES)) + ")"
)


class RequestSource(StrEnum):
    api = "api"
    cli = "cli"
    autoscaler = "autoscaler"
    webhook = "webhook"  # an inbound hook (Alertmanager, generic signed body)
    system = "system"  # the coordinator itself (reconciliation)
    scale_subresource = "scale-subresource"  # PUT /v1/deployments/{name}/scale (Kubernetes convention)
    self_heal = "self-heal"  # the coordinator, after losing an engine (app.backends.reference.liveness.heal)
    standing_target = "standing-target"  # the coordinator, completing a partial grow (app.scale.standing)


class CleanupState(StrEnum):
    none = "none"  # nothing retired (yet)
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"  # unresolved: blocks the deployment's next job until retried or acknowledged
    acknowledged = "acknowledged"  # an operator accepted the failure


class ReconfigurationJob(SQLModel, table=True):
    __tablename__ = "reconfigurations"
    __table_args__ = (
        sa.Index(
            "uq_reconfigurations_one_active_per_deployment",
            "deployment_id",
            unique=True,
            sqlite_where=_ACTIVE_PREDICATE,
            postgresql_where=_ACTIVE_PREDICATE,
        ),
        sa.Index("ix_reconfigurations_deployment_created", "deployment_id", "created_at"),
        # The list's filters with its order (`ORDER BY id DESC LIMIT n`): each serves filter and order
        # together, so a page reads n index entries instead of sorting every matching row.
        sa.Index("ix_reconfigurations_deployment_id_id", "deployment_id", "id"),
        sa.Index("ix_reconfigurations_deployment_state_id", "deployment_id", "state", "id"),
        sa.Index("ix_reconfigurations_state_id", "state", "id"),
        sa.Index("ix_reconfigurations_requested_by_id", "requested_by", "id"),
    )

    id: str = Field(primary_key=True, max_length=40)
    deployment_id: str = Field(foreign_key="deployments.id", max_length=40)
    state: str = Field(default=JobState.pending.value, sa_type=sa.String(16))
    from_dp_size: int
    to_dp_size: int
    from_generation: int
    to_generation: int
    requested_by: str = Field(sa_type=sa.String(32))
    requester: str | None = Field(default=None, max_length=128, description="the token name")
    reason: str | None = Field(default=None, max_length=1000)
    warmup_policy: str | None = Field(
        default=None, sa_type=sa.String(16), description="resolved: eager|deferred"
    )
    warmup_policy_requested: str = Field(sa_type=sa.String(16))
    strategy: str = Field(sa_type=sa.String(16))
    commit_mode: str = Field(
        default=CommitMode.coordinator.value,
        sa_type=sa.String(16),
        sa_column_kwargs={"server_default": CommitMode.coordinator.value},
        description="engines|coordinator; rows from before the column ran the coordinator's commit",
    )
    max_downtime_ms: int | None = Field(default=None, description="the downtime budget in force; NULL: none")
    progress_step: str | None = Field(default=None, max_length=200)
    progress_percent: float = 0.0
    phases: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    engine_results: list[Any] = Field(default_factory=list, sa_type=sa.JSON)
    downtime_ms: float | None = None
    downtime: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    client_outage_ms: float | None = Field(
        default=None,
        description="the canary probe's longest window in which canaries failed or missed their deadline",
    )
    client_slowest_answer_ms: float | None = Field(
        default=None, description="the canary probe's longest latency of a canary that succeeded"
    )
    client_downtime_ms: float | None = Field(
        default=None,
        description="jobs from before migration 0012: the probe's longest window with no successful canary "
        "(slow answers counted as an outage); newer jobs fill client_outage_ms instead",
    )
    probe: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    # What the deployment's front door counted while the job ran (issue 35); NULL: no front door.
    front_door_requests: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    error: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    cleanup_state: str = Field(default=CleanupState.none.value, sa_type=sa.String(16))
    cleanup: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    cancel_requested: bool = False
    force: bool = Field(
        default=False,
        description="created over a member the coordinator could not hear, or over a shrink that breaks "
        "coverage",
    )
    retire: list[str] | None = Field(
        default=None, sa_type=NullableJSON, description="engines the operator chose to leave"
    )
    # Partial growth (issue 38): a grow that gets only some of its engines commits what it reached
    # (never below the current size) unless `all_or_nothing`; the rest stands as the deployment's target.
    all_or_nothing: bool = False
    reached_dp_size: int | None = Field(default=None, description="the size the plan committed to")
    placement: dict[str, Any] | None = Field(
        default=None,
        sa_type=NullableJSON,
        description="the plan's rank map (old -> new) and what the new placement moves",
    )
    coverage: dict[str, Any] | None = Field(
        default=None,
        sa_type=NullableJSON,
        description="the new placement's coverage: experts with a single replica, per layer, engine, domain",
    )
    # Self-heal jobs (app/backends/reference/liveness/heal.py): when the loss happened, how long
    # recovery took.
    loss_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    time_to_detect_ms: float | None = None
    time_to_serving_ms: float | None = None
    # The incident a self-heal job recovers from, or one that hit this job's generation within a minute of
    # its end (`app.deployments.incidents`).
    incident_id: str | None = Field(default=None, max_length=40)
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    idempotency_key: str | None = Field(default=None, max_length=255)
    last_event_seq: int = Field(default=0, description="the seq of the newest event row (a per-job counter)")
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class JobEvent(SQLModel, table=True):
    """One row of a job's append-only log: a state transition or a progress/phase/engine/cleanup note."""

    __tablename__ = "job_events"
    __table_args__ = (sa.UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="reconfigurations.id", max_length=40)
    seq: int
    kind: str = Field(max_length=32, description="'transition', 'created', 'progress', 'phase', ...")
    from_state: str | None = Field(default=None, sa_type=sa.String(16))
    to_state: str | None = Field(default=None, sa_type=sa.String(16))
    message: str | None = Field(default=None, max_length=2000)
    data: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


class IdempotencyRecord(SQLModel, table=True):
    """An Idempotency-Key seen on a create request, scoped to the token that sent it."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (
        sa.UniqueConstraint("scope", "key", name="uq_idempotency_keys_scope_key"),
        sa.Index("ix_idempotency_keys_created_at", "created_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    scope: str = Field(max_length=128)
    key: str = Field(max_length=255)
    request_hash: str = Field(max_length=64)
    state: str = Field(sa_type=sa.String(16), description="in_flight | completed")
    job_id: str | None = Field(default=None, max_length=40)
    response_status: int | None = None
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


# --- API shapes ---------------------------------------------------------------------------------------


class ReconfigurationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422 naming it, never ignored

    deployment: str = ApiField(pattern=REF_PATTERN, description="the deployment's name")
    target_dp_size: int = ApiField(ge=1, le=1024, strict=True)
    warmup_policy: WarmupPolicyChoice | None = ApiField(None, description="default: the deployment's")
    strategy: Strategy | None = ApiField(None, description="default: the deployment's")
    commit: CommitMode | None = ApiField(
        None,
        description="who picks the switch boundary: `engines` (the coordinator arms them and they agree "
        "on it through their per-step collective; nothing from the coordinator inside the window) or "
        "`coordinator` (pause everywhere, then switch everywhere). Default: engines (coordinator for the "
        "blocking strategy, which does prepare's work inside the pause)",
    )
    max_downtime_ms: int | None = ApiField(
        None,
        ge=1,
        le=MAX_DOWNTIME_BUDGET_MS,
        strict=True,
        description="the downtime budget for this job (default: the deployment's): a commit window that "
        "would run longer ends on the old generation (rolled_back, downtime-budget-exceeded)",
    )
    reason: str | None = ApiField(None, max_length=1000)
    source: RequestSource | None = ApiField(None, description="api (default), cli or autoscaler")
    retire: list[Annotated[str, StringConstraints(pattern=ENGINE_ID_PATTERN)]] | None = ApiField(
        None,
        max_length=1024,
        description="scale-down only: the engines that leave (as many as the size shrinks by), instead "
        "of the highest ranks; the others are renumbered compactly",
    )
    force: bool = ApiField(
        False,
        strict=True,
        description="change the membership although the coordinator cannot hear every member (one whose "
        "control link is lost while its group steps: refused without it, `membership-unknown`), or "
        "shrink although the deployment would lose its coverage (`coverage-would-break`); recorded on "
        "the job",
    )
    all_or_nothing: bool = ApiField(
        False,
        strict=True,
        description="a grow that cannot get every engine it asks for fails with nothing committed. "
        "Default (false): it commits the largest size it reaches (never below the current one; reached "
        "none: it fails) and the rest stands as the deployment's target, completed by a later job when "
        "capacity appears (`reached_dp_size` on the job, `desired.standing_target` on the deployment)",
    )


class JobError(BaseModel):
    # Immutable: a changed error is a copy (`model_copy(update=...)`). The job row stores `stored()`.
    model_config = ConfigDict(frozen=True)

    phase: str | None = None
    engine_id: str | None = None
    type: str
    message: str
    http_status: int | None = ApiField(
        None, description="the engine's HTTP answer, for engines driven over their own API (vLLM)"
    )
    hint: str | None = ApiField(None, description="what to do about it, when there is something to do")
    overrun: DowntimeOverrun | None = ApiField(
        None, description="for `downtime-budget-exceeded`: which engine overran, in which part, by how much"
    )

    def stored(self) -> dict[str, Any]:
        """The JSON the job row keeps: the members given (an explicit null too), in field order."""
        return self.model_dump(mode="json", exclude_unset=True)


class PhaseTimes(BaseModel):
    started_at: datetime | None = None
    ended_at: datetime | None = None


class JobEventPublic(RowShape):
    seq: int
    kind: str
    from_state: JobState | None
    to_state: JobState | None
    message: str | None
    data: dict[str, Any] | None
    created_at: datetime


class Progress(BaseModel):
    step: str | None
    percent: float


class JobPublic(RowShape):
    """A job as the API, webhooks and the CLI show it."""

    id: str
    deployment_id: str
    deployment: str
    state: JobState
    terminal: bool
    from_dp_size: int
    to_dp_size: int
    from_generation: int
    to_generation: int
    requested_by: RequestSource
    requester: str | None
    reason: str | None
    warmup_policy: WarmupPolicy | None
    warmup_policy_requested: WarmupPolicyChoice
    strategy: Strategy
    commit: CommitMode
    max_downtime_ms: int | None = None
    progress: Progress
    phases: dict[str, PhaseTimes]
    engine_results: list[Any]
    downtime_ms: float | None
    downtime: dict[str, Any] | None
    client_outage_ms: float | None = ApiField(
        None,
        description="the client outage, measured from outside by the canary probe: the longest stretch "
        "with no successful answer (from the first canary left waiting after the last success to the "
        "next success; vLLM jobs: its 503 window); null where no probe ran",
    )
    client_slowest_answer_ms: float | None = ApiField(
        None,
        description="the slowest answer the canary probe got: the longest latency of a canary that "
        "succeeded (a pause stalls requests without failing them: it shows here); its phase is "
        "`probe.slowest_answer_phase`",
    )
    client_downtime_ms: float | None = ApiField(
        None,
        deprecated=True,
        description="deprecated: the client outage (`client_outage_ms`) for jobs that have one; for "
        "jobs recorded before the outage was defined, the probe's old figure (the longest window with "
        "no successful canary, which counted slow answers as an outage)",
    )
    probe: dict[str, Any] | None = ApiField(
        None,
        description="the canary probe's figures: outage and slowest answer with their phases, canaries "
        "sent/failed/late, the deadline, latencies, and per phase p50/p99, slowest answer, longest gap",
    )
    front_door_requests: dict[str, Any] | None = ApiField(
        None,
        description="request accounting at the deployment's front door while the job ran: `requests`, "
        "`failed` by cause (`5xx`, `connection`, `response`), `retried`, `redispatched`, per engine, and "
        "`drained` (per leaver: requests in flight when it was drained, and how long they took to finish), "
        "`held` (requests in flight while the commit window was open), and `by_sender`: `clients` and "
        "`canaries` (our probe's, which carry the `x-epctl-canary` header), each `requests` and `failed`, "
        "counted between `counted_from` and `counted_until` (each [before, after] its read, epoch "
        "seconds); the other counts include the canaries; null: no front door (or not measured)",
    )
    error: JobError | None
    cleanup_state: CleanupState
    cleanup: dict[str, Any] | None
    cancel_requested: bool
    force: bool = ApiField(
        False,
        description="created with `force: true`: over a member the coordinator could not hear, or over a "
        "shrink that would break the deployment's coverage",
    )
    retire: list[str] | None = ApiField(None, description="engines the operator chose to leave")
    all_or_nothing: bool = ApiField(
        False, description="a grow that cannot get every engine fails (false: it commits what it reaches)"
    )
    reached_dp_size: int | None = ApiField(
        None,
        description="the size the job's plan went to: `to_dp_size` (its target), or less where a grow got "
        "only some of its engines (the rest stands as the deployment's target); null: not planned yet",
    )
    placement: dict[str, Any] | None = ApiField(
        None,
        description="rank_map (engine id -> {old, new} rank; new is null for a leaver), copies_moved, "
        "bytes_moved, lower_bound (copies), balance (worst layer, mean/max rank load) and its fresh value",
    )
    coverage: dict[str, Any] | None = ApiField(
        None,
        description="the new placement's coverage: `covered`, `at_risk` (layer-expert pairs held by one "
        "engine only), `at_risk_domain` (held in one failure domain only; null with one domain), "
        "`per_layer` / `per_layer_domain`, `by_engine` / `by_domain` (where those single replicas sit), "
        "`examples`, and the failure-domain key (`data_host`)",
    )
    loss_at: datetime | None = ApiField(
        None,
        description="self-heal jobs: when the engine loss they recover from happened, as far as the "
        "coordinator can tell (the lost engine's last heartbeat, or when its group was found broken)",
    )
    time_to_detect_ms: float | None = ApiField(
        None, description="self-heal jobs: from `loss_at` to this job's creation (the loss detected)"
    )
    time_to_serving_ms: float | None = ApiField(
        None,
        description="self-heal jobs: from `loss_at` to this job's new generation serving (a shrink: "
        "serving again on the survivors; a grow-back: back to full size)",
    )
    incident_id: str | None = ApiField(
        None,
        description="the incident this job belongs to (`/v1/incidents/{id}`): for a self-heal job, the loss "
        "it recovers from; otherwise one that hit this job's generation within a minute of its end (an "
        "engine lost or frozen right after it). Clients' outage from the loss is on that record",
    )
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def derived(cls, row: ReconfigurationJob) -> dict[str, Any]:
        return {
            "terminal": JobState(row.state) in TERMINAL_STATES,
            "commit": row.commit_mode,
            "progress": Progress(step=row.progress_step, percent=row.progress_percent),
            "phases": row.phases or {},
            "engine_results": row.engine_results or [],
            "error": row.error or None,
            # The deprecated figure: the outage for jobs that have one, else what older jobs stored.
            "client_downtime_ms": row.client_outage_ms
            if row.client_outage_ms is not None
            else row.client_downtime_ms,
        }


class JobDetail(JobPublic):
    events: list[JobEventPublic]


class JobList(BaseModel):
    data: list[JobPublic]
    count: int | None = ApiField(
        description="jobs matching the filters, over all pages: counted on the first page (no cursor) as "
        "`?count=` asks (null for `none`); later pages repeat the first page's figure, carried in the cursor"
    )
    count_exact: bool = ApiField(
        True, description="false when `count` is a lower bound (the capped count stopped at its cap)"
    )
    next_cursor: str | None = ApiField(
        description="pass as `cursor` for the next (older) page; null at the end"
    )
