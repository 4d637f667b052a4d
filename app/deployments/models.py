"""Deployments: one EP group of engines serving one model, with its scaling limits and policies."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, model_validator
from pydantic import Field as ApiField
from sqlmodel import Field, SQLModel

from app.core.clock import utc_now
from app.core.db import UTCDateTime
from engine_agent.protocol import EngineConfig, Strategy

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class WarmupPolicyChoice(StrEnum):
    auto = "auto"  # deferred if any participant runs on ROCm, else eager
    eager = "eager"
    deferred = "deferred"


class LauncherKind(StrEnum):
    local = "local"  # the coordinator starts agent processes on this machine
    static = "static"  # agents register themselves; the pool is what registered


class DeploymentStatus(StrEnum):
    ready = "ready"
    degraded = "degraded"


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
    current_dp_size: int = 0
    generation: int = 0
    status: str = Field(default=DeploymentStatus.ready.value, sa_type=sa.String(16))
    autoscale_cooldown_s: float = 60.0
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


class DeploymentLimits(BaseModel):
    min_dp_size: int = ApiField(1, ge=1, le=1024)
    max_dp_size: int = ApiField(8, ge=1, le=1024)

    @model_validator(mode="after")
    def _min_not_above_max(self) -> DeploymentLimits:
        if self.min_dp_size > self.max_dp_size:
            raise ValueError(f"min_dp_size ({self.min_dp_size}) exceeds max_dp_size ({self.max_dp_size})")
        return self


class DeploymentCreate(DeploymentLimits):
    name: str = ApiField(pattern=NAME_PATTERN, description="a DNS-label style slug, unique")
    engine: EngineConfig = ApiField(default_factory=EngineConfig)
    launcher: LauncherKind = LauncherKind.local
    warmup_policy: WarmupPolicyChoice = WarmupPolicyChoice.auto
    strategy: Strategy = Strategy.background
    autoscale_cooldown_s: float = ApiField(60.0, ge=0)


class DeploymentUpdate(BaseModel):
    """Only the fields given change. Limits are checked against each other after merging."""

    min_dp_size: int | None = ApiField(None, ge=1, le=1024)
    max_dp_size: int | None = ApiField(None, ge=1, le=1024)
    warmup_policy: WarmupPolicyChoice | None = None
    strategy: Strategy | None = None
    autoscale_cooldown_s: float | None = ApiField(None, ge=0)


class DeploymentPublic(BaseModel):
    id: str
    name: str
    engine: EngineConfig
    launcher: LauncherKind
    min_dp_size: int
    max_dp_size: int
    warmup_policy: WarmupPolicyChoice
    strategy: Strategy
    autoscale_cooldown_s: float
    current_dp_size: int
    generation: int
    status: DeploymentStatus
    active_job_id: str | None = None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Deployment, *, active_job_id: str | None = None) -> DeploymentPublic:
        return cls(
            id=row.id,
            name=row.name,
            engine=EngineConfig.model_validate(row.engine_config),
            launcher=LauncherKind(row.launcher),
            min_dp_size=row.min_dp_size,
            max_dp_size=row.max_dp_size,
            warmup_policy=WarmupPolicyChoice(row.warmup_policy),
            strategy=Strategy(row.strategy),
            autoscale_cooldown_s=row.autoscale_cooldown_s,
            current_dp_size=row.current_dp_size,
            generation=row.generation,
            status=DeploymentStatus(row.status),
            active_job_id=active_job_id,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class DeploymentList(BaseModel):
    data: list[DeploymentPublic]
    count: int
