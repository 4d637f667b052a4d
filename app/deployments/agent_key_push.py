"""A rotated agent key told to the deployment's live agents (`POST /v1/agent-key`, sent with the keys
current until now), apart from `app.deployments.agent_keys` so that the record, which calls no agent,
can use that. An agent that answers 401 to every key the coordinator holds refuses it: the push says
which, for the rotation to repair (`app.deployments.router.rotate_agent_key`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from app.agents.client import AgentClient
from app.agents.errors import AgentCallError, AgentProblem
from app.deployments.agent_keys import Rotation

log = logging.getLogger(__name__)


@dataclass
class Pushed:
    told: list[str] = field(default_factory=list)
    not_told: dict[str, str] = field(default_factory=dict)  # engine id -> why
    refusing: list[str] = field(default_factory=list)  # answered 401 to every key we hold


async def push_rotation(rotation: Rotation) -> Pushed:
    """Tell every live agent the new key (authenticated with its current one, which is one of the keys
    the coordinator held until now), all at once (a frozen agent costs its call's deadline once, not
    once per agent after it); say which could not be told, and which refuse us."""

    async def tell(engine_id: str, url: str) -> AgentCallError | None:
        async with AgentClient(engine_id, url, keys=rotation.old_keys) as client:
            try:
                await client.rotate_key(rotation.new_key, rotation.overlap_s)
            except AgentCallError as exc:
                log.warning("agent key rotation: engine %s not told: %s", engine_id, exc)
                return exc
        return None

    errors = await asyncio.gather(*(tell(engine.engine_id, engine.url) for engine in rotation.engines))
    pushed = Pushed()
    for engine, error in zip(rotation.engines, errors, strict=True):
        if error is None:
            pushed.told.append(engine.engine_id)
            continue
        pushed.not_told[engine.engine_id] = str(error)[:300]
        if isinstance(error, AgentProblem) and error.status_code == 401:
            pushed.refusing.append(engine.engine_id)
    return pushed
