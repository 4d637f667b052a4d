"""The agent client long-polls agents that hold answers (one exchange per wait) and polls, as before,
agents that do not (no long-poll header) or refuse the parameters (422)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from app.agents.client import AgentClient
from engine_agent.protocol import (
    LONG_POLL_HEADER,
    ReconfigPhase,
    ReconfigStatus,
    Role,
    Strategy,
    WarmupPolicy,
)
from tests.support.served import Serve

JOB = "job-1"


def status(phase: ReconfigPhase) -> dict[str, Any]:
    return ReconfigStatus(
        job_id=JOB,
        generation=2,
        role=Role.staying,
        phase=phase,
        warmup_policy=WarmupPolicy.eager,
        strategy=Strategy.background,
        updated_at=time.time(),
    ).model_dump(mode="json")


def client_for(serve: Serve, app: FastAPI, *, timeout_s: float = 1.0) -> AgentClient:
    """A client of `app` served over real HTTP (the client speaks to sockets only)."""
    return AgentClient("engine-a", serve(app), timeout_s=timeout_s)


def long_polling_agent(seen: list[dict[str, str]]) -> FastAPI:
    """Holds nothing really: answers `paused` to a long-poll for it, `pausing` to anything else."""
    app = FastAPI()

    @app.get("/v1/reconfig")
    async def reconfig(request: Request) -> JSONResponse:
        params = dict(request.query_params)
        seen.append(params)
        held = params.get("job_id") == JOB and "paused" in params.get("until", "").split(",")
        phase = ReconfigPhase.paused if held and float(params.get("wait_s", 0)) > 0 else ReconfigPhase.pausing
        return JSONResponse(status(phase), headers={LONG_POLL_HEADER: "30"})

    @app.post("/v1/reconfig/pause")
    async def pause(request: Request) -> JSONResponse:
        seen.append(dict(request.query_params))
        waited = float(request.query_params.get("wait_s", 0)) > 0
        phase = ReconfigPhase.paused if waited else ReconfigPhase.pausing
        return JSONResponse(status(phase), status_code=202, headers={LONG_POLL_HEADER: "30"})

    return app


def strict_old_agent(seen: list[dict[str, str]], phases: list[ReconfigPhase]) -> FastAPI:
    """An older agent that refuses unknown parameters with 422 and reaches `phases` poll by poll."""
    app = FastAPI()
    polls = {"n": 0}

    def refused() -> JSONResponse:
        return JSONResponse({"detail": "unknown parameter"}, status_code=422)

    @app.get("/v1/reconfig")
    async def reconfig(request: Request) -> JSONResponse:
        seen.append(dict(request.query_params))
        if request.query_params:
            return refused()
        phase = phases[min(polls["n"], len(phases) - 1)]
        polls["n"] += 1
        return JSONResponse(status(phase))

    @app.post("/v1/reconfig/pause")
    async def pause(request: Request) -> JSONResponse:
        seen.append(dict(request.query_params))
        if request.query_params:
            return refused()
        return JSONResponse(status(ReconfigPhase.pausing), status_code=202)

    return app


def test_wait_for_phase_long_polls_an_agent_that_holds_answers(serve_app: Serve) -> None:
    seen: list[dict[str, str]] = []

    async def go() -> ReconfigStatus:
        async with client_for(serve_app, long_polling_agent(seen)) as client:
            return await client.wait_for_phase(
                JOB, {ReconfigPhase.paused}, deadline_s=5.0, poll_interval_s=0.01
            )

    assert asyncio.run(go()).phase == ReconfigPhase.paused
    assert len(seen) == 1 and seen[0]["job_id"] == JOB and seen[0]["until"] == "paused"


def test_a_step_given_wait_s_asks_the_agent_to_hold_its_answer(serve_app: Serve) -> None:
    seen: list[dict[str, str]] = []

    async def go() -> tuple[ReconfigStatus, AgentClient]:
        async with client_for(serve_app, long_polling_agent(seen)) as client:
            return await client.pause(JOB, wait_s=2.0), client

    answer, client = asyncio.run(go())
    assert answer.phase == ReconfigPhase.paused and float(seen[0]["wait_s"]) == 2.0
    assert client.long_poll is True and client.last_step_status == answer


def test_an_agent_refusing_the_parameters_is_sent_the_step_plainly_and_polled(serve_app: Serve) -> None:
    seen: list[dict[str, str]] = []
    agent = strict_old_agent(seen, [ReconfigPhase.pausing, ReconfigPhase.pausing, ReconfigPhase.paused])

    async def go() -> tuple[ReconfigStatus, ReconfigStatus, AgentClient]:
        async with client_for(serve_app, agent) as client:
            sent = await client.pause(JOB, wait_s=2.0)
            reached = await client.wait_for_phase(
                JOB, {ReconfigPhase.paused}, deadline_s=5.0, poll_interval_s=0.01
            )
            return sent, reached, client

    sent, reached, client = asyncio.run(go())
    assert sent.phase == ReconfigPhase.pausing and reached.phase == ReconfigPhase.paused
    assert client.long_poll is False
    assert seen[0] and seen[1] == {}  # the step: refused with wait_s, then sent without
    assert all(params == {} for params in seen[2:]) and len(seen) == 5  # then plain polls
