"""A deployment's front door as its record names it (`front_door` on the deployment): its URL, what
keeps it in step with the rank-set feed (`app.frontdoor`), and the last feed version that keeper applied."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from pydantic import Field as ApiField
from sqlmodel import Field, Session, SQLModel, col, select

from app.core.clock import utc_now
from app.core.db import NullableJSON, UTCDateTime


class FrontDoor(SQLModel, table=True):
    __tablename__ = "front_doors"

    deployment_id: str = Field(primary_key=True, max_length=40)
    url: str = Field(max_length=512)
    keeper: str = Field(max_length=200)
    applied_version: int | None = None
    applied_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The front door's own counters when it applied that version (e.g. HAProxy's per-server counters).
    counters: dict[str, Any] | None = Field(default=None, sa_type=NullableJSON)
    updated_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)


class FrontDoorPublic(BaseModel):
    url: str = ApiField(description="where clients send requests (e.g. http://127.0.0.1:8001/v1/infer)")
    keeper: str = ApiField(description="what keeps it in step with the feed")
    applied_version: int | None = ApiField(None, description="the last resourceVersion it applied")
    applied_at: datetime | None = None

    @classmethod
    def of(cls, row: FrontDoor) -> FrontDoorPublic:
        return cls(
            url=row.url, keeper=row.keeper, applied_version=row.applied_version, applied_at=row.applied_at
        )


def front_doors_of(session: Session, deployment_ids: Collection[str]) -> dict[str, FrontDoorPublic]:
    """The front doors of these deployments (one query), by deployment id."""
    if not deployment_ids:
        return {}
    rows = session.exec(select(FrontDoor).where(col(FrontDoor.deployment_id).in_(list(deployment_ids)))).all()
    return {row.deployment_id: FrontDoorPublic.of(row) for row in rows}
