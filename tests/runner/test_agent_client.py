"""The coordinator's agent client maps every failure to a typed error naming the engine."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from app import metrics
from app.agents.client import AgentClient
from app.agents.errors import AgentDeadlineExceeded, AgentPhaseFailed, AgentProblem, AgentUnreachable
from app.backends.base import JobFailure
from engine_agent.protocol import AgentError, ReconfigPhase, ReconfigStatus, Role, Strategy, WarmupPolicy
from tests.support.served import Serve


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


# What an agent answers a call that does not fit its job (`engine_agent.problems`).
AGENT_PROBLEM = {
    "type": "urn:epctl:problem:not-prepared",
    "title": "Conflict",
    "status": 409,
    "detail": "no prepared job job-1",
    "code": "not-prepared",
}


def fake_agent(
    phases: list[ReconfigPhase], *, error: AgentError | None = None, problem: dict[str, Any] = AGENT_PROBLEM
) -> FastAPI:
    app = FastAPI()
    polls = {"n": 0}

    @app.get("/v1/reconfig")
    async def reconfig() -> dict[str, Any]:
        phase = phases[min(polls["n"], len(phases) - 1)]
        polls["n"] += 1
        return status(phase, error=error if phase == ReconfigPhase.failed else None)

    @app.post("/v1/reconfig/sync")
    async def sync() -> JSONResponse:
        return JSONResponse(problem, status_code=409, media_type="application/problem+json")

    @app.post("/v1/reconfig/switch")
    async def switch() -> dict[str, Any]:
        await asyncio.sleep(2)
        return status(ReconfigPhase.switching)

    return app


def client_for(serve: Serve, app: FastAPI, *, timeout_s: float = 1.0) -> AgentClient:
    """A client of `app` served over real HTTP (the client speaks to sockets only)."""
    return AgentClient("engine-a", serve(app), timeout_s=timeout_s)


@pytest.mark.parametrize(
    "problem",
    [
        AGENT_PROBLEM,
        {
            "type": "https://example.test/problems/not-prepared",
            "status": 409,
            "detail": "no prepared job job-1",
        },
    ],
    ids=["agent-problem-with-code", "foreign-problem-type-uri"],
)
def test_problem_json_becomes_agent_problem_with_its_code_and_detail(
    problem: dict[str, Any], serve_app: Serve
) -> None:
    async def go() -> None:
        with pytest.raises(AgentProblem) as caught:
            async with client_for(serve_app, fake_agent([ReconfigPhase.prepared], problem=problem)) as client:
                await client.sync("job-1")
        assert caught.value.engine_id == "engine-a"
        assert caught.value.type == "not-prepared"
        assert caught.value.status_code == 409
        assert "no prepared job job-1" in caught.value.message
        assert JobFailure.from_exception("syncing", caught.value).error.phase == "syncing"

    asyncio.run(go())


def test_a_call_past_its_deadline_raises_deadline_exceeded(serve_app: Serve) -> None:
    async def go() -> None:
        with pytest.raises(AgentDeadlineExceeded) as caught:
            async with client_for(serve_app, fake_agent([ReconfigPhase.paused]), timeout_s=0.1) as client:
                await client.switch("job-1")
        assert caught.value.engine_id == "engine-a"

    asyncio.run(go())


def test_nothing_listening_raises_unreachable() -> None:
    async def go() -> None:
        async with AgentClient("engine-b", "http://127.0.0.1:9", timeout_s=1.0) as client:
            with pytest.raises(AgentUnreachable) as caught:
                await client.info()
        assert caught.value.type == "agent-unreachable"
        assert caught.value.engine_id == "engine-b"

    asyncio.run(go())


def test_wait_for_phase_returns_once_the_phase_is_reached(serve_app: Serve) -> None:
    async def go() -> None:
        app = fake_agent([ReconfigPhase.preparing, ReconfigPhase.preparing, ReconfigPhase.prepared])
        seen: list[ReconfigPhase] = []
        async with client_for(serve_app, app) as client:
            got = await client.wait_for_phase(
                "job-1",
                {ReconfigPhase.prepared},
                deadline_s=2.0,
                poll_interval_s=0.01,
                on_status=lambda s: seen.append(s.phase),
            )
        assert got.phase == ReconfigPhase.prepared
        assert seen == [ReconfigPhase.preparing, ReconfigPhase.preparing, ReconfigPhase.prepared]

    asyncio.run(go())


def test_wait_for_phase_raises_the_agents_error_when_it_fails(serve_app: Serve) -> None:
    async def go() -> None:
        app = fake_agent(
            [ReconfigPhase.preparing, ReconfigPhase.failed],
            error=AgentError(type="policy-mismatch", message="e1 holds deferred", step="warmup"),
        )
        with pytest.raises(AgentPhaseFailed) as caught:
            async with client_for(serve_app, app) as client:
                await client.wait_for_phase(
                    "job-1", {ReconfigPhase.prepared}, deadline_s=2.0, poll_interval_s=0.01
                )
        assert caught.value.type == "policy-mismatch"
        assert "e1 holds deferred" in caught.value.message

    asyncio.run(go())


def test_wait_for_phase_gives_up_at_its_deadline(serve_app: Serve) -> None:
    async def go() -> None:
        with pytest.raises(AgentDeadlineExceeded):
            async with client_for(serve_app, fake_agent([ReconfigPhase.preparing])) as client:
                await client.wait_for_phase(
                    "job-1", {ReconfigPhase.prepared}, deadline_s=0.2, poll_interval_s=0.02
                )

    asyncio.run(go())


def test_wait_for_phase_ignores_another_jobs_status(serve_app: Serve) -> None:
    async def go() -> None:
        with pytest.raises(AgentDeadlineExceeded):
            async with client_for(serve_app, fake_agent([ReconfigPhase.prepared])) as client:
                await client.wait_for_phase(
                    "job-2", {ReconfigPhase.prepared}, deadline_s=0.2, poll_interval_s=0.02
                )

    asyncio.run(go())


def agent_calls(operation: str, outcome: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "epctl_agent_calls_total", {"operation": operation, "outcome": outcome}
    )
    return value or 0.0


def test_every_call_is_counted_in_epctl_agent_calls_by_operation_and_outcome(serve_app: Serve) -> None:
    async def go() -> None:
        async with client_for(serve_app, fake_agent([ReconfigPhase.prepared])) as client:
            await client.reconfig()
            with pytest.raises(AgentProblem):
                await client.sync("job-1")
        async with AgentClient("engine-b", "http://127.0.0.1:9", timeout_s=1.0) as down:
            with pytest.raises(AgentUnreachable):
                await down.info()

    before = {
        key: agent_calls(*key) for key in [("reconfig", "ok"), ("sync", "error"), ("info", "unreachable")]
    }
    asyncio.run(go())
    assert {key: agent_calls(*key) - value for key, value in before.items()} == {
        ("reconfig", "ok"): 1.0,
        ("sync", "error"): 1.0,
        ("info", "unreachable"): 1.0,
    }
