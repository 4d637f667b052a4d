"""Path and query parameter types with the limits every router shares.

Checked by FastAPI before a handler runs, so a hostile value is a 422 problem on SQLite and Postgres
alike and never reaches the database: identifiers and names are short ASCII slugs (no NUL, no `/`, no
line break, nothing the two databases would treat differently), times convert to UTC without
overflowing, offsets and ids fit the 64-bit columns.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import AfterValidator, BeforeValidator

# Every id the coordinator makes (`rcfg_...`, `dep_...`), deployment and token names, engine ids.
REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
# Engine ids (an agent's `--engine-id`): letters, digits, `.`, `_`, `:`, `-`; 1-128 characters, starting
# with a letter or digit. Safe in a URL path, a file name and a log line.
ENGINE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_OFFSET = INT32_MAX


def _utc(value: datetime) -> datetime:
    """Naive times are UTC; a time whose UTC form leaves years 1-9999 is refused (not an overflow)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time is out of range once converted to UTC") from None


_RFC3339_START = re.compile(r"^\d{4}-\d{2}-\d{2}")


def _time_text(value: Any) -> Any:
    """Times are RFC 3339 text: pydantic would also take a bare number as Unix seconds (`0.5`), which
    the schema (`format: date-time`) does not promise and a caller almost certainly did not mean."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not _RFC3339_START.match(value):
        raise ValueError("expected an RFC 3339 time, e.g. 2026-12-01T12:00:00Z")
    return value


TimeText = BeforeValidator(_time_text)
UtcDateTime = Annotated[datetime, TimeText, AfterValidator(_utc)]

JobIdPath = Annotated[str, Path(pattern=REF_PATTERN, description="a reconfiguration id (`rcfg_...`)")]
DeploymentRefPath = Annotated[str, Path(pattern=REF_PATTERN, description="a deployment's name or id")]
EngineIdPath = Annotated[str, Path(pattern=ENGINE_ID_PATTERN, description="the engine's id")]
WebhookIdPath = Annotated[str, Path(pattern=REF_PATTERN, description="a subscription id (`whk_...`)")]
TokenRefPath = Annotated[str, Path(pattern=REF_PATTERN, description="a token's id or name")]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="rows to skip")]
DeploymentFilterQuery = Annotated[
    str | None, Query(pattern=REF_PATTERN, description="only this deployment (name or id)")
]
