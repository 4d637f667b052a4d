"""The feed's record: one row per change of a deployment's rank set (its `resourceVersion`), kept for a
while so a watch sees every change once and in order, across coordinator restarts. (The front door's
own record is the deployment's: `app.deployments.front_door`.)"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict
from pydantic import Field as ApiField
from sqlmodel import Field, SQLModel

from app.core.clock import utc_now
from app.core.db import UTCDateTime
from app.deployments.front_door import FrontDoorPublic
from app.frontdoor.rules import EndpointState


class EndpointSetVersion(SQLModel, table=True):
    __tablename__ = "endpoint_set_versions"

    deployment_id: str = Field(primary_key=True, max_length=40)
    resource_version: int = Field(primary_key=True)
    generation: int
    job_id: str | None = Field(default=None, max_length=40)
    endpoints: list[Any] = Field(default_factory=list, sa_type=sa.JSON)
    changed_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


class EndpointPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    engine_id: str
    address: str = ApiField(description="the engine's serving address (its `/v1/infer` is under it)")
    dp_rank: int | None
    generation: int = ApiField(description="the generation the engine is on, as recorded")
    state: EndpointState = ApiField(
        description="ready: send it requests; draining: finish what it holds, send nothing new; "
        "out: send nothing"
    )
    reason: str | None = ApiField(
        None,
        description="why it is not ready: joining, not-a-member, leaving in job ..., fenced, unreachable, "
        "paused, or lost (it left the serving generation without a job, e.g. written off after it died: "
        "listed until a generation forms without it)",
    )


class EndpointSetPublic(BaseModel):
    """A deployment's rank set as a router should use it."""

    model_config = ConfigDict(populate_by_name=True)

    deployment: str
    generation: int = ApiField(description="the deployment's serving generation")
    resource_version: int = ApiField(
        alias="resourceVersion",
        description="bumped by every change; pass it to `?watch=true` to wait for the next",
    )
    job_id: str | None = ApiField(None, description="the active job when this version was made")
    changed_at: datetime
    endpoints: list[EndpointPublic]
    front_door: FrontDoorPublic | None = None
