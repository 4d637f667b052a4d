"""A rotated agent key told to the deployment's live agents (`POST /v1/agent-key`, sent with the old
key), apart from `app.deployments.agent_keys` so that the record, which calls no agent, can use that."""

from __future__ import annotations

import logging

from app.agents.client import AgentClient
from app.agents.errors import AgentCallError
from app.deployments.agent_keys import AgentKeyPublic, Rotation

log = logging.getLogger(__name__)


async def push_rotation(rotation: Rotation) -> AgentKeyPublic:
    """Tell every live agent the new key (with the old one); say which could not be told."""
    pushed: list[str] = []
    failed: dict[str, str] = {}
    for engine_id, url in rotation.engines:
        async with AgentClient(engine_id, url, keys=rotation.old_keys) as client:
            try:
                await client.rotate_key(rotation.new_key, rotation.overlap_s)
                pushed.append(engine_id)
            except AgentCallError as exc:
                log.warning("agent key rotation: engine %s not told: %s", engine_id, exc)
                failed[engine_id] = str(exc)[:300]
    return rotation.public.model_copy(update={"pushed_to": pushed, "not_pushed": failed})
