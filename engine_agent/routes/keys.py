"""The coordinator's push of a rotated agent key (authenticated with the key current until then)."""

from __future__ import annotations

from fastapi import APIRouter

from engine_agent.problems import problem_responses
from engine_agent.protocol import AgentKeyRotated, AgentKeyRotation
from engine_agent.routes.deps import AgentDep

router = APIRouter(tags=["agent"])


@router.post("/v1/agent-key", responses=problem_responses(401, 422))
def rotate_agent_key(body: AgentKeyRotation, agent: AgentDep) -> AgentKeyRotated:
    """`key` becomes the agent key; the key this call was made with stays accepted `overlap_s` more
    (calls in flight, peers not told yet). Only the digests are kept."""
    agent.keys.rotate(body.key.get_secret_value(), body.overlap_s)
    return AgentKeyRotated(overlap_s=body.overlap_s)
