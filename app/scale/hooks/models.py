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
    accepted = "accepted"  # a job was created for the intent
    deferred = "deferred"  # recorded; acted on when an active job or the cooldown ends (no repeat needed)
    held = "held"  # recorded; the stabilization rule holds it (window, a higher ask, the max step)
    paused = "paused"  # recorded; the deployment's autoscaling is paused
    withdrawn = "withdrawn"  # its desired size was dropped before it was acted on (resolved, expired)
    superseded = "superseded"  # an operator's job, a /scale write or its group's newer intent replaced it
    ignored = "ignored"  # a duplicate, already at the size, or nothing to withdraw
    rejected = "rejected"  # unknown deployment, malformed body, unusable labels


# Decisions about an intent: each is announced (webhook event `autoscaler.decision`) and counted.
INTENT_DECISIONS = frozenset(
    {
        HookDecision.accepted,
        HookDecision.deferred,
        HookDecision.held,
        HookDecision.paused,
        HookDecision.withdrawn,
        HookDecision.superseded,
        HookDecision.ignored,
    }
)


class InboundHookRequest(SQLModel, table=True):
    __tablename__ = "inbound_hook_requests"
    __table_args__ = (
        sa.Index("ix_inbound_hook_requests_deployment_created", "deployment_id", "created_at"),
        sa.Index("ix_inbound_hook_requests_created_at", "created_at"),
        # One deciding record per signed request and per notification identity: a second copy cannot
        # be inserted (copies are recorded as duplicates, with both columns NULL and `duplicate_of` set).
        sa.UniqueConstraint("webhook_id", name="uq_inbound_hook_requests_webhook_id"),
        sa.UniqueConstraint("identity", name="uq_inbound_hook_requests_identity"),
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
    identity: str | None = Field(
        default=None, max_length=64, description="what an Alertmanager notification asks, hashed (unique)"
    )
    duplicate_of: str | None = Field(default=None, max_length=40, description="the record this repeats")
    intent_id: str | None = Field(default=None, max_length=40, description="the intent it decided about")
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


# --- API shapes ---------------------------------------------------------------------------------------


DECISION_CODES = (
    "why, as a slug: scaling; active-job, cooldown, job-refused, scale-subresource (deferred); "
    "stabilization-window, higher-intent, max-step (held); paused; resolved, left-group, expired "
    "(withdrawn); operator-job, replaced (superseded); duplicate, already-at-size, alert-skipped "
    "(ignored); unknown-deployment, unusable-labels, too-many-deployments, or the problem code of a "
    "refused request (rejected)"
)


class HookOutcome(BaseModel):
    request_id: str = ApiField(description="the recorded request (see GET /v1/hooks/requests)")
    decision: HookDecision
    code: str = ApiField(description=DECISION_CODES)
    reason: str
    deployment: str | None
    requested_dp_size: int | None
    target_dp_size: int | None
    job_id: str | None
    intent_id: str | None = ApiField(None, description="the intent this decided about")
    duplicate_of: str | None = ApiField(
        None, description="a duplicate: the record of the decision it repeats"
    )
    next_scale_at: datetime | None = ApiField(
        None, description="deferred or held: when the coordinator may act, if known (no repeat needed)"
    )


class AlertmanagerOutcome(BaseModel):
    results: list[HookOutcome] = ApiField(
        description="one per deployment named, and per group of skipped alerts"
    )


class HookRequestPublic(RowShape):
    id: str
    source: HookSource
    decision: HookDecision
    code: str = ApiField(description=DECISION_CODES)
    reason: str
    deployment: str | None
    deployment_id: str | None
    requested_dp_size: int | None
    target_dp_size: int | None
    job_id: str | None = ApiField(
        description="the job created for its intent: by this request, or later by the coordinator"
    )
    intent_id: str | None
    intent_state: str | None = ApiField(
        None, description="its intent now: pending, acted, withdrawn, superseded or ended"
    )
    duplicate_of: str | None
    requester: str | None
    details: dict[str, Any] | None
    created_at: datetime

    @classmethod
    def derived(cls, row: InboundHookRequest) -> dict[str, Any]:
        return {
            "deployment": row.deployment_name,
            "details": row.payload,
            "code": str((row.payload or {}).get("code", "")),
        }


class HookRequestList(BaseModel):
    data: list[HookRequestPublic]
    count: int = ApiField(description="requests matching the filters, over all pages")
