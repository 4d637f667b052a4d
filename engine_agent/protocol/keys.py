"""The agent key's life on the wire: the coordinator's push of a rotated key (`POST /v1/agent-key`) and
its bounds."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr

MAX_KEY_OVERLAP_S = 7 * 86400.0


class AgentKeyRotation(BaseModel):
    """The coordinator's push of a rotated agent key (`POST /v1/agent-key`)."""

    key: SecretStr = Field(min_length=16, max_length=256, description="the new agent key")
    overlap_s: float = Field(
        gt=0, le=MAX_KEY_OVERLAP_S, description="how long the key current until now stays accepted"
    )


class AgentKeyRotated(BaseModel):
    overlap_s: float
