"""Test-only fault injection: the route exists only on an agent started with --enable-fault-injection
(`engine_agent.api.create_app` registers it then, and only then; elsewhere it is a 404)."""

from __future__ import annotations

from fastapi import APIRouter

from engine_agent.problems import ProblemError, problem_responses
from engine_agent.protocol import FaultInjection
from engine_agent.routes.deps import AgentDep

router = APIRouter(tags=["testing"])


@router.post("/v1/faults", responses=problem_responses(404, 422))
def faults(body: FaultInjection, agent: AgentDep) -> FaultInjection:
    if not agent.settings.enable_fault_injection:  # a second lock: never reached when unregistered
        raise ProblemError(404, "fault-injection-disabled", "fault injection is not enabled on this agent")
    agent.executor.inject(body)
    if body.slow_steps:
        agent.engine.slow_down(body.slow_steps, body.slow_step_s)
    return body
