"""API tokens: stored as sha256 hashes; the secret is shown once, at creation."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict
from pydantic import Field as ApiField
from sqlmodel import Field, SQLModel

from app.core.auth import TokenRole
from app.core.clock import utc_now
from app.core.db import UTCDateTime
from app.core.shapes import RowShape


class ApiToken(SQLModel, table=True):
    __tablename__ = "api_tokens"

    id: str = Field(primary_key=True, max_length=40)
    name: str = Field(max_length=128, sa_column_kwargs={"unique": True})
    role: str = Field(sa_type=sa.String(16))
    token_hash: str = Field(max_length=64, sa_column_kwargs={"unique": True})
    token_prefix: str = Field(max_length=16, description="the secret's first characters, to recognise it")
    created_by: str | None = Field(default=None, max_length=128)
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    last_used_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = ApiField(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@-]+$")
    role: TokenRole


class TokenPublic(RowShape):
    id: str
    name: str
    role: TokenRole
    token_prefix: str
    created_by: str | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenPublic):
    token: str = ApiField(description="the secret: shown only in this response")


class TokenList(BaseModel):
    data: list[TokenPublic]
    count: int
