"""The coordinator's agent client maps every failure to a typed error naming the engine."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from app.agents.client import (
    AgentClient,
    AgentDeadlineExceeded,
    AgentPhaseFailed,
    AgentProblem,
    AgentUnreachable,
)
from engine_agent.protocol import AgentError, ReconfigPhase, ReconfigStatus, Role, Strategy, WarmupPolicy


def status(phase: ReconfigPhase, *, job_id: str = "job-1", error: AgentError | None = None) -> dict[str, Any]:
    return ReconfigStatus(
        job_id=job_id,
        generation=2,
        role=Role.staying,
        phase=phase,
        warmup_policy=WarmupPolicy.eager,
        strategy=Strategy.background,
        error=error,
        updated_at=time.time(),
    ).model_dump(mode="json")


def fake_agent(phases: list[ReconfigPhase], *, error: AgentError | None = None) -> FastAPI:
    app = FastAPI()
    polls = {"n": 0}

    @app.get("/v1/reconfig")
    async def reconfig() -> dict[str, Any]:
        phase = phases[min(polls["n"], len(phases) - 1)]
        polls["n"] += 1
        return status(phase, error=error if phase == ReconfigPhase.failed else None)

    @app.post("/v1/reconfig/sync")
    async def sync() -> JSONResponse:
        return JSONResponse(
            {
                "type": "https://epctl.dev/problems/not_prepared",
                "title": "Not prepared",
                "status": 409,
                "detail": "no prepared job job-1",
            },
            status_code=409,
            media_type="application/problem+json",
        )

    @app.post("/v1/reconfig/switch")
    async def switch() -> dict[str, Any]:
        await asyncio.sleep(2)
        return status(ReconfigPhase.switching)

    return app


def client_for(app: FastAPI, *, timeout_s: float = 1.0) -> AgentClient:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    return AgentClient("engine-a", "http://agent", http=http, timeout_s=timeout_s)


def test_problem_json_becomes_agent_problem_with_its_type_and_detail() -> None:
    async def go() -> None:
        with pytest.raises(AgentProblem) as caught:
            await client_for(fake_agent([ReconfigPhase.prepared])).sync("job-1")
        assert caught.value.engine_id == "engine-a"
        assert caught.value.type == "not_prepared"
        assert caught.value.status_code == 409
        assert "no prepared job job-1" in caught.value.message
        assert caught.value.as_error("syncing")["phase"] == "syncing"

    asyncio.run(go())


def test_a_call_past_its_deadline_raises_deadline_exceeded() -> None:
    async def go() -> None:
        with pytest.raises(AgentDeadlineExceeded) as caught:
            await client_for(fake_agent([ReconfigPhase.paused]), timeout_s=0.1).switch("job-1")
        assert caught.value.engine_id == "engine-a"

    asyncio.run(go())


def test_nothing_listening_raises_unreachable() -> None:
    async def go() -> None:
        async with AgentClient("engine-b", "http://127.0.0.1:9", timeout_s=1.0) as client:
            with pytest.raises(AgentUnreachable) as caught:
                await client.info()
        assert caught.value.type == "agent_unreachable"
        assert caught.value.engine_id == "engine-b"

    asyncio.run(go())


def test_wait_for_phase_returns_once_the_phase_is_reached() -> None:
    async def go() -> None:
        app = fake_agent([ReconfigPhase.preparing, ReconfigPhase.preparing, ReconfigPhase.prepared])
        seen: list[ReconfigPhase] = []
        got = await client_for(app).wait_for_phase(
            "job-1",
            {ReconfigPhase.prepared},
            deadline_s=2.0,
            poll_interval_s=0.01,
            on_status=lambda s: seen.append(s.phase),
        )
        assert got.phase == ReconfigPhase.prepared
        assert seen == [ReconfigPhase.preparing, ReconfigPhase.preparing, ReconfigPhase.prepared]

    asyncio.run(go())


def test_wait_for_phase_raises_the_agents_error_when_it_fails() -> None:
    async def go() -> None:
        app = fake_agent(
            [ReconfigPhase.preparing, ReconfigPhase.failed],
            error=AgentError(type="policy_mismatch", message="e1 holds deferred", step="warmup"),
        )
        with pytest.raises(AgentPhaseFailed) as caught:
            await client_for(app).wait_for_phase(
                "job-1", {ReconfigPhase.prepared}, deadline_s=2.0, poll_interval_s=0.01
            )
        assert caught.value.type == "policy_mismatch"
        assert "e1 holds deferred" in caught.value.message

    asyncio.run(go())


def test_wait_for_phase_gives_up_at_its_deadline() -> None:
    async def go() -> None:
        with pytest.raises(AgentDeadlineExceeded):
            await client_for(fake_agent([ReconfigPhase.preparing])).wait_for_phase(
                "job-1", {ReconfigPhase.prepared}, deadline_s=0.2, poll_interval_s=0.02
            )

    asyncio.run(go())


def test_wait_for_phase_ignores_another_jobs_status() -> None:
    async def go() -> None:
        with pytest.raises(AgentDeadlineExceeded):
            await client_for(fake_agent([ReconfigPhase.prepared])).wait_for_phase(
                "job-2", {ReconfigPhase.prepared}, deadline_s=0.2, poll_interval_s=0.02
            )

    asyncio.run(go())
