"""Inbound autoscaler requests (`/v1/hooks/...`), each recorded with what the coordinator decided."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.core.clock import utc_now
from app.core.db import NullableJSON, UTCDateTime


class HookSource(StrEnum):
    generic = "generic"  # a signed generic JSON body
    alertmanager = "alertmanager"  # Prometheus Alertmanager's webhook format


class HookDecision(StrEnum):
    accepted = "accepted"  # a job was created
    ignored = "ignored"  # e.g. inside the cooldown, or already at the (clamped) size
    rejected = "rejected"  # bad signature, unknown deployment, malformed body


class InboundHookRequest(SQLModel, table=True):
    __tablename__ = "inbound_hook_requests"
    __table_args__ = (sa.Index("ix_inbound_hook_requests_deployment_created", "deployment_id", "created_at"),)

    id: str = Field(primary_key=True, max_length=40)
    source: str = Field(sa_type=sa.String(16))
    deployment_name: str | None = Field(default=None, max_length=63)
    deployment_id: str | None = Field(
        default=None, max_length=40, description="no foreign key: an audit record"
    )
    requested_dp_size: int | None = None
    target_dp_size: int | None = Field(default=None, description="after min/max clamping")
    decision: str = Field(sa_type=sa.String(16))
    reason: str = Field(max_length=1000)
    job_id: str | None = Field(default=None, max_length=40)
    requester: str | None = Field(default=None, max_length=128)
    payload: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
