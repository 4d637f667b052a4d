"""What this agent is and holds; a warm spare's preload (issue 38)."""

from __future__ import annotations

from fastapi import APIRouter

from engine_agent.problems import ProblemError, problem_responses
from engine_agent.protocol import AgentInfo, SpareHeld
from engine_agent.routes.deps import AgentDep

router = APIRouter(tags=["agent"])


@router.get("/v1/info")
def info(agent: AgentDep) -> AgentInfo:
    result: AgentInfo = agent.info()
    return result


@router.post("/v1/spare", responses=problem_responses(409))
def spare(agent: AgentDep) -> SpareHeld:
    """Become a warm spare: hold every expert of every layer (from the checkpoint) before joining, so
    the job that makes this engine a member copies its rows locally. Again: a no-op. Refused (409) while
    it serves a generation."""
    if agent.engine.active is not None:
        raise ProblemError(409, "serving", "a member of a generation is no spare")
    held = agent.resident.hold_all(agent.config, agent.device)
    if agent.engine.active is not None:  # it joined meanwhile: its own buffers hold its rows
        agent.resident.drop()
        raise ProblemError(409, "serving", "it joined a generation while loading")
    return SpareHeld(spare_bytes=held)
