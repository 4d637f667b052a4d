"""A rotated agent key told to the deployment's live agents (`POST /v1/agent-key`, sent with the old
key), apart from `app.deployments.agent_keys` so that the record, which calls no agent, can use that."""

from __future__ import annotations

import asyncio
import logging

from app.agents.client import AgentClient
from app.agents.errors import AgentCallError
from app.deployments.agent_keys import AgentKeyPublic, Rotation

log = logging.getLogger(__name__)


async def push_rotation(rotation: Rotation) -> AgentKeyPublic:
    """Tell every live agent the new key (with the old one), all at once (a frozen agent costs its call's
    deadline once, not once per agent after it); say which could not be told."""

    async def tell(engine_id: str, url: str) -> str | None:
        async with AgentClient(engine_id, url, keys=rotation.old_keys) as client:
            try:
                await client.rotate_key(rotation.new_key, rotation.overlap_s)
            except AgentCallError as exc:
                log.warning("agent key rotation: engine %s not told: %s", engine_id, exc)
                return str(exc)[:300]
        return None

    errors = await asyncio.gather(*(tell(engine_id, url) for engine_id, url in rotation.engines))
    outcome = dict(zip((engine_id for engine_id, _ in rotation.engines), errors, strict=True))
    pushed = [engine_id for engine_id, error in outcome.items() if error is None]
    failed = {engine_id: error for engine_id, error in outcome.items() if error is not None}
    return rotation.public.model_copy(update={"pushed_to": pushed, "not_pushed": failed})
