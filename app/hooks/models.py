"""Inbound autoscaler requests (`/v1/hooks/...`), each recorded with what the coordinator decided."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from pydantic import Field as ApiField
from sqlmodel import Field, SQLModel

from app.core.clock import utc_now
from app.core.db import NullableJSON, UTCDateTime
from app.core.shapes import RowShape


class HookSource(StrEnum):
    generic = "generic"  # a signed generic JSON body
    alertmanager = "alertmanager"  # Prometheus Alertmanager's webhook format


class HookDecision(StrEnum):
    accepted = "accepted"  # a job was created
    ignored = "ignored"  # e.g. a duplicate, or already at the (clamped) size
    deferred = "deferred"  # the desired size is recorded; the reconciler acts once nothing blocks it
    rejected = "rejected"  # bad signature, unknown deployment, malformed body


class InboundHookRequest(SQLModel, table=True):
    __tablename__ = "inbound_hook_requests"
    __table_args__ = (
        sa.Index("ix_inbound_hook_requests_deployment_created", "deployment_id", "created_at"),
        sa.Index("ix_inbound_hook_requests_created_at", "created_at"),
        # One record per signed request: a second copy of the same webhook-id cannot be inserted.
        sa.UniqueConstraint("webhook_id", name="uq_inbound_hook_requests_webhook_id"),
    )

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
    webhook_id: str | None = Field(
        default=None, max_length=128, description="a signed request's verified webhook-id (unique)"
    )
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


# --- API shapes ---------------------------------------------------------------------------------------


class HookOutcome(BaseModel):
    request_id: str = ApiField(description="the recorded request (see GET /v1/hooks/requests)")
    decision: HookDecision
    code: str = ApiField(
        description="why, as a slug: scaling, duplicate, active-job, cooldown, already-at-size, job-refused, "
        "unknown-deployment, alert-skipped (resolved), unusable-labels, or the problem code of a refused "
        "request"
    )
    reason: str
    deployment: str | None
    requested_dp_size: int | None
    target_dp_size: int | None
    job_id: str | None
    next_scale_at: datetime | None = ApiField(
        None, description="deferred for the cooldown: when the reconciler may act (no repeat needed)"
    )


class AlertmanagerOutcome(BaseModel):
    results: list[HookOutcome] = ApiField(
        description="one per deployment named, and per group of skipped alerts"
    )


class HookRequestPublic(RowShape):
    id: str
    source: HookSource
    decision: HookDecision
    reason: str
    deployment: str | None
    deployment_id: str | None
    requested_dp_size: int | None
    target_dp_size: int | None
    job_id: str | None
    requester: str | None
    details: dict[str, Any] | None
    created_at: datetime

    @classmethod
    def derived(cls, row: InboundHookRequest) -> dict[str, Any]:
        return {"deployment": row.deployment_name, "details": row.payload}


class HookRequestList(BaseModel):
    data: list[HookRequestPublic]
    count: int = ApiField(description="requests matching the filters, over all pages")
