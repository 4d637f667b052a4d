"""The coordinator's push of a rotated agent key, accepted only with the agent's *current* key (the
gate refuses the previous one here, even inside its overlap: a rotated-out key can never rotate)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from engine_agent.auth import digest
from engine_agent.gate import Guard
from engine_agent.problems import problem_responses
from engine_agent.protocol import AgentKeyRotated, AgentKeyRotation
from engine_agent.routes.deps import AgentDep

router = APIRouter(tags=["agent"])


@router.post("/v1/agent-key", responses=problem_responses(401, 422))
def rotate_agent_key(body: AgentKeyRotation, agent: AgentDep, request: Request) -> AgentKeyRotated:
    """`key` becomes the agent key; the key this call was made with stays accepted `overlap_s` more
    (calls in flight, peers not told yet), then never again. Only the digests are kept."""
    new_key = body.key.get_secret_value()
    agent.keys.rotate(new_key, body.overlap_s)
    guard = getattr(request.app.state, "guard", None)
    if isinstance(guard, Guard) and request.client is not None:
        # Who told us the new key proved it: it keeps working from there even while that address is
        # throttled (engine_agent.throttle).
        guard.throttle.succeeded(request.client.host, digest(new_key))
    return AgentKeyRotated(overlap_s=body.overlap_s)
