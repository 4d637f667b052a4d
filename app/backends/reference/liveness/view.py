"""What one pass sees of a deployment: its engines as their heartbeats left them, its active and newest
jobs, what the coordinator hears at all, what the I/O probes found, and what this controller remembers
from its earlier passes. Plain frozen values (no rows, no session): the judge is a function of a view
and `now`, so every rule is a table row (tests/runner/test_liveness_rules.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from app.core.stuck import Stuck
from app.deployments.engines.models import EngineState
from app.deployments.models import OnEngineLoss

# An engine in one of these states heartbeats (or has yet to): silence past the timeout makes it lost.
LIVE_STATES = frozenset(
    {
        EngineState.registered.value,
        EngineState.serving.value,
        EngineState.idle.value,
        EngineState.paused.value,
    }
)
# ... and these engines count as heard, for "does the coordinator hear anyone at all".
HEARD_STATES = LIVE_STATES | {EngineState.fenced.value}


class Answer(StrEnum):
    """What a member answered a starting coordinator's `GET /v1/info` (`adoption`)."""

    serving = "serving"  # serving (or paused) the recorded generation
    changed = "changed"  # another state or generation: its record takes what it says
    gone = "gone"  # connection refused: nothing listens
    silent = "silent"  # no answer within the agent call deadline


@dataclass(frozen=True)
class Asked:
    """One member's answer at start, with what it reported (for `changed`)."""

    answer: Answer
    state: str | None = None
    generation: int = 0
    rank: int | None = None
    world_size: int = 0


class Reply(StrEnum):
    """What a suspect answered the coordinator's own `/healthz` probe (`probes.reply_of`)."""

    answered = "answered"  # any HTTP answer: its process runs (slow, perhaps, but not frozen)
    silent = "silent"  # connected, no answer within the probe's deadline: frozen (or hopelessly slow)
    gone = "gone"  # connection refused: nothing listens


@dataclass(frozen=True)
class Probed:
    """The coordinator's probe of a freeze suspect: when it started, and its reply (None: pending)."""

    started_at: datetime
    reply: Reply | None = None


@dataclass(frozen=True)
class EngineSeen:
    """One engine of the deployment (not `left`), as its row says."""

    id: str
    state: str
    generation: int = 0
    dp_rank: int | None = None
    world_size: int = 0
    last_heartbeat_at: datetime | None = None
    url: str = ""
    pid: int | None = None
    launched_by: str = "local"
    created_at: datetime | None = None
    updated_at: datetime | None = None
    # The last group that broke under it, whom it found unresponsive then, and when it said so.
    broken_generation: int | None = None
    unresponsive_peers: tuple[str, ...] = ()
    broken_reported_at: datetime | None = None
    data_unreachable: tuple[str, ...] = ()  # peers its data network does not reach
    group_steps: int = 0  # lock-step iterations counted (each a collective with every member)
    link_lost_at: datetime | None = None
    # Its last heartbeat this coordinator shed while saturated (`app.core.shedding`): heard, not recorded.
    shed_at: datetime | None = None
    # It refuses the coordinator's agent key (issue 32's condition `engine-refuses-agent-key`, filled in by
    # the observer once the record carries it): never counted a serving member, never a survivor.
    refuses_agent_key: bool = False
    # Its heartbeat's report that it is stuck in a serving collective (`app.core.stuck`), and this
    # coordinator's probe of it as a freeze suspect (issue 39; None: none).
    stuck: Stuck | None = None
    probed: Probed | None = None
    # Observations of this pass's I/O steps (None: not asked).
    process_gone: bool | None = None  # `probes.process_gone`: connection refused at its URL
    asked: Asked | None = None  # a starting coordinator's question (`adoption`)


@dataclass(frozen=True)
class JobSeen:
    """One of the deployment's jobs: the active one, or one of the newest."""

    id: str
    state: str
    requested_by: str
    created_at: datetime
    updated_at: datetime
    from_dp_size: int = 0
    to_dp_size: int = 0
    to_generation: int = 0
    # Phase and participants of an active job (`phases` and `engine_results` of its row).
    phase: str | None = None
    participants: tuple[str, ...] = ()
    clients_out_at_end: bool = False  # its probe's canaries had no answer when it ended


@dataclass(frozen=True)
class Hearing:
    """What this coordinator hears, over every deployment."""

    newest_heartbeat_at: datetime | None  # the freshest heartbeat of any engine that beats
    watching_since: datetime  # when this coordinator started watching (silence counts from then)
    deaf_at: datetime | None = None  # the last pass at which it heard no engine at all


@dataclass(frozen=True)
class DeploymentView:
    id: str
    name: str
    launcher: str
    policy: OnEngineLoss  # `on_engine_loss`, its default resolved
    current_dp_size: int
    generation: int
    status: str
    status_detail: dict[str, Any] | None
    hearing: Hearing
    engines: tuple[EngineSeen, ...] = ()
    active_job: JobSeen | None = None
    newest_jobs: tuple[JobSeen, ...] = ()  # newest first
    # Self-healing's memory on the row: engines written off since it was last whole, when the loss
    # happened, and (`replace`) the size to grow back to.
    heal_lost: str | None = None
    heal_loss_at: datetime | None = None
    heal_target_dp_size: int | None = None
    spares: int = 0  # warm spares it keeps (issue 38): a loss is healed onto them at full size
    # This controller's memory: since when it has seen the deployment not whole (the health
    # confirmation), None when it was whole at the last pass.
    broken_since: datetime | None = None
    at_start: bool = False  # a starting coordinator's pass (members were asked: `Asked`)
    updated_at: datetime | None = None

    @property
    def reason(self) -> str | None:
        return (self.status_detail or {}).get("reason")

    def engine(self, engine_id: str) -> EngineSeen:
        return next(e for e in self.engines if e.id == engine_id)


@dataclass(frozen=True)
class Rules:
    """The numbers the judge reads (the coordinator's settings)."""

    heartbeat_timeout_s: float = 15.0
    fence_grace_s: float = 15.0  # a fenced engine silent this long is written off
    health_confirm_s: float = 0.0  # not whole (though heartbeating) this long before `degraded`
    retry_after_s: float = 10.0  # after a self-heal job that did not succeed, before the next
    max_attempts: int = 3  # self-heal jobs in a row that did not succeed, before self-healing stops
    hit_window_s: float = 60.0  # a job that ended this long before an incident is the one it hit
