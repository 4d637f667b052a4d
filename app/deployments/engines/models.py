"""Engines: the registered agents, one DP rank each."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict
from pydantic import Field as ApiField
from sqlmodel import Field, SQLModel

from app.api.params import ENGINE_ID_PATTERN, INT32_MAX, INT64_MAX, REF_PATTERN
from app.core.clock import utc_now
from app.core.db import NullableJSON, UTCDateTime
from app.core.shapes import RowShape
from app.core.urls import PRINTABLE_HTTP_URL_PATTERN, HttpUrlText
from app.deployments.models import EngineConfigSpec
from engine_agent.protocol import AgentHeartbeat, AgentRegistration, Platform

# The last second a datetime holds (9999-12-31T23:59:59Z): a reported epoch past it is refused, not a 500.
EPOCH_S_MAX = 253_402_300_799.0


class EngineState(StrEnum):
    registered = "registered"  # announced itself, no heartbeat yet
    serving = "serving"
    idle = "idle"  # in no generation (a joiner before its switch, or after leaving the group)
    paused = "paused"
    left = "left"  # deregistered: kept for history, never picked again
    unreachable = "unreachable"  # heartbeats stopped
    # Out of its generation on evidence that it stalled (every other member named it when the group
    # broke, or it did not answer a restarted coordinator): not stopped, re-admitted if it comes back
    # within the heartbeat timeout, written off after it.
    fenced = "fenced"


# An engine in one of these states serves its generation (paused inside a commit window still counts).
SERVING_STATES = frozenset({EngineState.serving.value, EngineState.paused.value})


class Engine(SQLModel, table=True):
    __tablename__ = "engines"

    id: str = Field(primary_key=True, max_length=128, description="the agent's engine_id")
    deployment_id: str = Field(foreign_key="deployments.id", index=True, max_length=40)
    url: str = Field(max_length=512)
    platform: str = Field(sa_type=sa.String(16))
    device: str = Field(max_length=64)
    state: str = Field(default=EngineState.registered.value, sa_type=sa.String(16))
    dp_rank: int | None = None
    world_size: int = 0
    generation: int = 0
    last_heartbeat_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    launched_by: str = Field(sa_type=sa.String(16))
    # Where its process runs (from its registration): a coordinator on the same host can stop an engine
    # another coordinator launched (`app.launchers.local`).
    pid: int | None = None
    hostname: str | None = Field(default=None, max_length=255)
    # The last group that broke under it (from its heartbeats) and whom it found unresponsive then.
    broken_generation: int | None = None
    unresponsive_peers: list[str] | None = Field(default=None, sa_type=NullableJSON)
    broken_reported_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # When that group last stepped on it (its own clock): its clients were served until then.
    broken_last_step_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Its data address, and what its data network reaches (peers that did not accept a connection).
    data_host: str | None = Field(default=None, max_length=255)
    data_unreachable: list[str] | None = Field(default=None, sa_type=NullableJSON)
    group_steps: int = Field(default=0, sa_type=sa.BigInteger)
    # The coordinator stopped hearing it while its group kept stepping (its peers vouch for it): the
    # control link is lost, not the engine (`app.backends.reference.liveness.engines.peers_vouch`).
    link_lost_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Since when it holds another agent key than the coordinator sends (its heartbeat's key check, or a
    # call with the current key answered 401): it refuses the coordinator (`refuses_key`).
    key_refused_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


def refuses_key(engine: Engine) -> bool:
    """The engine refuses the coordinator's agent key: no job can reach it, so it is no member the
    deployment can count on (not `ready` over it, not a survivor to heal on) until it is restarted with
    the current key (`POST /v1/deployments/{name}/agent-key/rotate` repairs what it can)."""
    return engine.key_refused_at is not None and engine.state != EngineState.left.value


class EngineRegistration(AgentRegistration):
    """`POST /v1/engines`: the agent's registration with the limits the coordinator stores (the same on
    SQLite and Postgres) and no unknown fields."""

    model_config = ConfigDict(extra="forbid")

    engine_id: str = ApiField(pattern=ENGINE_ID_PATTERN, description="1-128 of [A-Za-z0-9._:-]")
    deployment: str = ApiField(pattern=REF_PATTERN, description="the deployment's name or id")
    url: HttpUrlText = ApiField(min_length=1, max_length=512, pattern=PRINTABLE_HTTP_URL_PATTERN)
    device: str = ApiField(min_length=1, max_length=64, pattern=r"^[!-~]+$")
    engine: EngineConfigSpec
    generation: int = ApiField(0, ge=0, le=INT32_MAX, strict=True)
    rank: int | None = ApiField(None, ge=0, le=INT32_MAX, strict=True)
    pid: int | None = ApiField(None, ge=1, le=INT32_MAX, strict=True)
    hostname: str | None = ApiField(None, min_length=1, max_length=255, pattern=r"^[!-~]+$")
    data_host: str | None = ApiField(None, min_length=1, max_length=255, pattern=r"^[!-~]+$")


_AGENT_SAYS = AgentHeartbeat.model_fields  # the agent's own descriptions, kept where a field is narrowed


class EngineHeartbeat(AgentHeartbeat):
    """`POST /v1/engines/{engine_id}/heartbeat`, with the stored columns' limits."""

    model_config = ConfigDict(extra="forbid")

    generation: int = ApiField(ge=0, le=INT32_MAX, strict=True)
    rank: int | None = ApiField(None, ge=0, le=INT32_MAX, strict=True)
    world_size: int = ApiField(0, ge=0, le=INT32_MAX, strict=True)
    serving_steps: int = ApiField(
        0, ge=0, le=INT64_MAX, strict=True, description="real serving steps so far (the last step's number)"
    )
    broken_generation: int | None = ApiField(None, ge=1, le=INT32_MAX, strict=True)
    unresponsive_peers: list[Annotated[str, ApiField(pattern=ENGINE_ID_PATTERN)]] = ApiField(
        default_factory=list, max_length=1024
    )
    broken_last_step_at: float | None = ApiField(None, ge=0, le=EPOCH_S_MAX, strict=True)
    group_steps: int = ApiField(0, ge=0, le=INT64_MAX, strict=True)
    data_unreachable: list[Annotated[str, ApiField(pattern=ENGINE_ID_PATTERN)]] = ApiField(
        default_factory=list, max_length=1024
    )
    # Strict like the rest: in pydantic's lax mode `false` is a number 0, which the schema refuses.
    stuck_generation: int | None = ApiField(
        None, ge=1, le=INT32_MAX, strict=True, description=_AGENT_SAYS["stuck_generation"].description
    )
    stuck_ms: float | None = ApiField(
        None, ge=0, le=86_400_000, strict=True, description=_AGENT_SAYS["stuck_ms"].description
    )
    stuck_unanswered: list[Annotated[str, ApiField(pattern=ENGINE_ID_PATTERN)]] = ApiField(
        default_factory=list, max_length=1024, description=_AGENT_SAYS["stuck_unanswered"].description
    )


class EnginePublic(RowShape):
    id: str
    deployment_id: str
    deployment: str
    url: str
    platform: Platform
    device: str
    state: EngineState
    dp_rank: int | None
    world_size: int
    generation: int
    last_heartbeat_at: datetime | None
    launched_by: str
    pid: int | None = None
    hostname: str | None = None
    broken_generation: int | None = None
    unresponsive_peers: list[str] | None = None
    broken_last_step_at: datetime | None = ApiField(
        None, description="when `broken_generation` last stepped on it, as it reported (its clock)"
    )
    data_host: str | None = None
    data_unreachable: list[str] | None = ApiField(
        None, description="peers whose data address it could not reach (its last heartbeat)"
    )
    link_lost_at: datetime | None = ApiField(
        None,
        description="since when the coordinator cannot hear it while its group steps: its control link is "
        "lost, not the engine (the deployment's `conditions` say so; no self-heal)",
    )
    key_refused_at: datetime | None = ApiField(
        None,
        description="since when it refuses the coordinator's agent key (the deployment's `conditions` say "
        "so; `POST .../agent-key/rotate` restarts it where its launcher can)",
    )
    role: str | None = ApiField(
        None,
        description="in the engines list: `member` (on a rank of its deployment's generation), `spare` (a "
        "warm spare its deployment keeps: idle, holding every expert) or null",
    )
    created_at: datetime
    updated_at: datetime


class EngineHeartbeatAnswer(EnginePublic):
    """The heartbeat's answer: the engine as recorded, and every coordinator sharing the database, so
    an agent fails over to another when the one it talks to dies."""

    coordinators: list[str] = ApiField(
        default_factory=list, description="the live coordinators' URLs (heartbeat to any of them)"
    )


class EngineList(BaseModel):
    data: list[EnginePublic]
    count: int
