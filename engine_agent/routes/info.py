"""What this agent is and holds."""

from __future__ import annotations

from fastapi import APIRouter

from engine_agent.protocol import AgentInfo
from engine_agent.routes.deps import AgentDep

router = APIRouter(tags=["agent"])


@router.get("/v1/info")
def info(agent: AgentDep) -> AgentInfo:
    result: AgentInfo = agent.info()
    return result
