"""The agent key's life on the wire: the coordinator's push of a rotated key (`POST /v1/agent-key`), the
bounds of an overlap, and the key's public fingerprint that heartbeats carry."""

from __future__ import annotations

import hashlib
import hmac

from pydantic import BaseModel, Field, SecretStr

# An overlap long enough to tell every agent and for the calls already on their way to land; at most a
# week. There is no "until the next rotation": every previous key has an end.
MIN_KEY_OVERLAP_S = 10.0
MAX_KEY_OVERLAP_S = 7 * 86400.0
KEY_CHECK_CONTEXT = b"epctl agent key check v1"


def key_check(key: str) -> str:
    """A short public fingerprint of an agent key (16 hex digits of HMAC-SHA256 keyed by it): an agent's
    heartbeat carries its current key's, so the coordinator sees an engine that holds another key than
    the one it sends, without either side showing the key."""
    return hmac.new(key.encode(), KEY_CHECK_CONTEXT, hashlib.sha256).hexdigest()[:16]


class AgentKeyRotation(BaseModel):
    """The coordinator's push of a rotated agent key (`POST /v1/agent-key`), accepted only with the
    agent's current key."""

    key: SecretStr = Field(min_length=16, max_length=256, description="the new agent key")
    overlap_s: float = Field(
        ge=MIN_KEY_OVERLAP_S,
        le=MAX_KEY_OVERLAP_S,
        description="how long the key current until now stays accepted (then never again)",
    )


class AgentKeyRotated(BaseModel):
    overlap_s: float
