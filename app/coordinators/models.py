"""The coordinators sharing this database: who is alive, at which URL. Agents heartbeat to any of them
(the heartbeat's answer lists them), so a coordinator that dies costs no engine its heartbeats."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel

from app.core.clock import utc_now
from app.core.db import UTCDateTime


class Coordinator(SQLModel, table=True):
    __tablename__ = "coordinators"

    id: str = Field(primary_key=True, max_length=255, description="its lease owner name")
    url: str = Field(max_length=512, description="the URL its local agents register with")
    hostname: str = Field(max_length=255)
    pid: int
    started_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    last_seen_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime, index=True)
