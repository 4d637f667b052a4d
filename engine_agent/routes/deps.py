"""What the agent's routes share: the agent as a typed dependency, and the problems they raise."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from engine_agent.agent import Agent
from engine_agent.problems import ProblemError, problem_responses

PROBLEM_RESPONSES = problem_responses(409, 422)


def get_agent(request: Request) -> Agent:
    agent = getattr(request.app.state, "agent", None)
    if not isinstance(agent, Agent):
        raise ProblemError(503, "starting", "the agent is still starting")
    return agent


AgentDep = Annotated[Agent, Depends(get_agent)]
