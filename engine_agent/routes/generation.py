"""A peer's notice that the serving generation's group broke (`engine_agent.peers`)."""

from __future__ import annotations

from fastapi import APIRouter

from engine_agent.protocol import GenerationBroken, GenerationBrokenAnswer
from engine_agent.routes.deps import AgentDep

router = APIRouter(tags=["serving"])


@router.post("/v1/generation/broken")
def generation_broken(body: GenerationBroken, agent: AgentDep) -> GenerationBrokenAnswer:
    """Give up the group of `generation` at once (no-op when this engine serves another one)."""
    reason = f"{body.reporter or 'a peer'} reported it broken: {body.reason}"[:1000]
    return GenerationBrokenAnswer(abandoned=agent.engine.abandon(body.generation, reason))
