"""The cleanup worker: its status, and the operator's way out of a failed cleanup."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from engine_agent.problems import ProblemError
from engine_agent.protocol import CleanupStatus
from engine_agent.routes.deps import PROBLEM_RESPONSES, AgentDep

router = APIRouter(tags=["cleanup"])


@router.get("/v1/cleanup")
def cleanup_status(agent: AgentDep) -> CleanupStatus:
    result: CleanupStatus = agent.cleanup.status()
    return result


@router.post("/v1/cleanup/retry", status_code=202, responses=PROBLEM_RESPONSES)
def cleanup_retry(agent: AgentDep) -> JSONResponse:
    if not agent.cleanup.retry():
        raise ProblemError(409, "no-cleanup-failure", "no failed cleanup to retry")
    return JSONResponse(agent.cleanup.status().model_dump(mode="json"), status_code=202)


@router.post("/v1/cleanup/acknowledge", responses=PROBLEM_RESPONSES)
def cleanup_acknowledge(agent: AgentDep) -> CleanupStatus:
    if agent.cleanup.acknowledge() is None:
        raise ProblemError(409, "no-cleanup-failure", "no failed cleanup to acknowledge")
    result: CleanupStatus = agent.cleanup.status()
    return result
