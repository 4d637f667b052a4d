"""API tokens: stored as sha256 hashes; the secret is shown once, at creation."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict
from pydantic import Field as ApiField
from sqlmodel import Field, SQLModel

from app.core.auth import TokenRole
from app.core.clock import utc_now
from app.core.db import UTCDateTime
from app.core.shapes import RowShape

# `epctl_`, the marker every generated token starts with, tells nothing about a secret; of the secret
# itself at most this many characters are ever stored or shown (enough to tell tokens apart in a list).
SECRET_MARKER = "epctl_"
SHOWN_SECRET_CHARS = 4


def shown_prefix(secret: str) -> str:
    """What of a secret is kept and shown: the marker, if any, and the first `SHOWN_SECRET_CHARS` of the
    rest (older rows kept 12 characters: cut to as many here)."""
    marker = SECRET_MARKER if secret.startswith(SECRET_MARKER) else ""
    return marker + secret[len(marker) : len(marker) + SHOWN_SECRET_CHARS]


class ApiToken(SQLModel, table=True):
    __tablename__ = "api_tokens"

    id: str = Field(primary_key=True, max_length=40)
    name: str = Field(max_length=128, sa_column_kwargs={"unique": True})
    role: str = Field(sa_type=sa.String(16))
    token_hash: str = Field(max_length=64, sa_column_kwargs={"unique": True})
    token_prefix: str = Field(
        max_length=16, description="the secret's first characters, to recognise it (`shown_prefix`)"
    )
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
    token_prefix: str = ApiField(
        description=f"the marker `{SECRET_MARKER}` if the token has it, then at most "
        f"{SHOWN_SECRET_CHARS} characters of the secret"
    )
    created_by: str | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def derived(cls, row: Any) -> Mapping[str, Any]:
        return {"token_prefix": shown_prefix(row.token_prefix)}


class TokenCreated(TokenPublic):
    token: str = ApiField(description="the secret: shown only in this response")


class TokenList(BaseModel):
    data: list[TokenPublic]
    count: int
