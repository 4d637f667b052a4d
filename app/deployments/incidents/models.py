"""Incidents: every time a deployment stopped being whole, what was lost and how long clients waited.

An incident opens when a deployment becomes `degraded` (an engine lost, frozen or unreachable, a group
broken, a switch failed part-way) and resolves when it is `ready` again, both in the transaction that
changes the status (`app.deployments.status`). It links the job whose generation it hit when that job
ended within the minute before, and the self-heal jobs that recovered from it; those jobs link back
(`incident_id`).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

import sqlalchemy as sa
from pydantic import BaseModel
from pydantic import Field as ApiField
from sqlmodel import Field, SQLModel

from app.core.clock import utc_now
from app.core.db import UTCDateTime
from app.core.shapes import RowShape

INCIDENT_ID_PREFIX = "inc"


class IncidentState(StrEnum):
    open = "open"
    resolved = "resolved"


class Incident(SQLModel, table=True):
    __tablename__ = "incidents"
    __table_args__ = (sa.Index("ix_incidents_deployment_state", "deployment_id", "state"),)

    id: str = Field(primary_key=True, max_length=40)
    deployment_id: str = Field(foreign_key="deployments.id", max_length=40)
    state: str = Field(default=IncidentState.open.value, sa_type=sa.String(16))
    reason: str = Field(max_length=64)
    message: str = Field(max_length=2000)
    generation: int = Field(description="the generation it hit")
    engines: list[str] = Field(default_factory=list, sa_type=sa.JSON, description="the engines lost")
    loss_at: datetime = Field(sa_type=UTCDateTime)
    detected_at: datetime = Field(sa_type=UTCDateTime)
    serving_again_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    time_to_detect_ms: float = 0.0
    time_to_serving_ms: float | None = None
    client_outage_ms: float | None = None
    # What the loss time and the outage's start rest on (`app.deployments.incidents.outage`).
    loss_evidence: str | None = Field(default=None, sa_type=sa.String(16))
    outage_started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    outage_evidence: str | None = Field(default=None, sa_type=sa.String(16))
    hit_job_id: str | None = Field(default=None, max_length=40)
    recovery_job_ids: list[str] = Field(default_factory=list, sa_type=sa.JSON)
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


class IncidentPublic(RowShape):
    """An incident as the API, the CLI, the dashboard and its webhook events show it."""

    id: str
    deployment_id: str
    deployment: str = ""
    state: IncidentState
    reason: str = ApiField(description="why the deployment was degraded (the status reason at the time)")
    message: str
    generation: int = ApiField(description="the generation it hit")
    engines: list[str] = ApiField(description="the engines lost (written off or fenced)")
    loss_at: datetime = ApiField(
        description="when it happened, on the best evidence (`loss_evidence`): when the survivors' group "
        "last stepped (the agents' record), else the lost engine's last heartbeat, else when found"
    )
    loss_evidence: str | None = ApiField(
        None, description="what `loss_at` rests on: agents, heartbeat or detected (null: recorded before)"
    )
    detected_at: datetime = ApiField(description="when the deployment was marked degraded")
    serving_again_at: datetime | None = ApiField(description="when it was ready again")
    time_to_detect_ms: float
    time_to_serving_ms: float | None = ApiField(description="from loss_at to serving again")
    client_outage_ms: float | None = ApiField(
        description="what clients saw: from the outage's start (`outage_started_at`) to the first moment "
        "the deployment served again (a canary answered, or the recovery's generation served); null while "
        "not over, or when nothing measured it (`outage_evidence` not-measured), never a 0 nobody saw"
    )
    outage_started_at: datetime | None = ApiField(
        None, description="when clients lost service, on the evidence `outage_evidence` names"
    )
    outage_evidence: str | None = ApiField(
        None,
        description="what the client outage rests on: job-probe (a job's canaries saw it begin), agents "
        "(when the survivors' group last served), canaries (the incident's own, from loss_at) or "
        "not-measured",
    )
    hit_job_id: str | None = ApiField(
        description="the job it hit: one that made its generation and ended within the minute before, or "
        "one that ended (rolled back) while its clients had no answer; that job carries the same client "
        "outage"
    )
    recovery_job_ids: list[str] = ApiField(description="the self-heal jobs that recovered from it")
    created_at: datetime
    updated_at: datetime


class IncidentList(BaseModel):
    data: list[IncidentPublic]
    count: int
