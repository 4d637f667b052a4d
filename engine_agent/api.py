"""The agent's HTTP API. Long operations answer 202 at once and are observed by polling
`GET /v1/reconfig`; every error is application/problem+json (RFC 9457)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine_agent.agent import Agent
from engine_agent.engine import EngineUnavailable
from engine_agent.executor import Conflict, InvalidRequest
from engine_agent.protocol import (
    AgentInfo,
    CleanupStatus,
    FaultInjection,
    InferRequest,
    InferResponse,
    JobRef,
    PauseRequest,
    PrepareRequest,
    ReconfigStatus,
)
from engine_agent.settings import AgentSettings

log = logging.getLogger(__name__)

PROBLEM = "application/problem+json"


class Problem(Exception):
    def __init__(
        self, status: int, title: str, detail: str, type_: str = "about:blank", **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.type, self.extra = status, title, detail, type_, extra


def problem_response(request: Request, problem: Problem) -> JSONResponse:
    body = {
        "type": problem.type,
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
        "instance": request.url.path,
        **problem.extra,
    }
    return JSONResponse(body, status_code=problem.status, media_type=PROBLEM)


def _typed(code: str) -> str:
    return f"urn:epctl:agent:{code}"


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    409: {"description": "Wrong job or phase (problem+json; `code` says which)"},
    422: {"description": "Invalid request body (problem+json)"},
}


def get_agent(request: Request) -> Agent:
    agent = getattr(request.app.state, "agent", None)
    if not isinstance(agent, Agent):
        raise Problem(503, "Starting", "the agent is still starting", _typed("starting"), code="starting")
    return agent


AgentDep = Annotated[Agent, Depends(get_agent)]


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


def create_app(
    settings: AgentSettings | None = None,
    *,
    url: str | None = None,
    agent_factory: Callable[[AgentSettings, str], Agent] | None = None,
) -> FastAPI:
    """The agent's ASGI app. Nothing starts until the app's lifespan runs (serving it): building the
    app (for the OpenAPI document, or at import of engine_agent.main) is cheap."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        resolved = settings or AgentSettings()
        advertised = url or resolved.url or f"http://{resolved.advertised_host()}:{resolved.port}"
        factory = agent_factory or Agent
        agent = await asyncio.to_thread(factory, resolved, advertised)
        app.state.agent = agent
        log.info("agent %s serving at %s (store %s)", agent.engine_id, advertised, agent.store_address)
        try:
            yield
        finally:
            await asyncio.to_thread(agent.close)

    app = FastAPI(
        title="epctl engine agent",
        version="1",
        summary="One engine's agent: reference MoE serving and the reconfiguration executor",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
    )

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(request, exc)

    @app.exception_handler(Conflict)
    async def _conflict(request: Request, exc: Conflict) -> JSONResponse:
        return problem_response(request, Problem(409, "Conflict", str(exc), _typed(exc.type), code=exc.type))

    @app.exception_handler(InvalidRequest)
    async def _invalid(request: Request, exc: InvalidRequest) -> JSONResponse:
        return problem_response(
            request,
            Problem(422, "Invalid request", str(exc), _typed("invalid_request"), code="invalid_request"),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        return problem_response(
            request,
            Problem(
                422,
                "Invalid request",
                detail,
                _typed("invalid_request"),
                code="invalid_request",
                errors=errors,
            ),
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem_response(request, Problem(exc.status_code, str(exc.detail), str(exc.detail)))

    @app.get("/healthz", tags=["health"])
    def healthz(agent: AgentDep) -> dict[str, str]:
        return {"status": "ok", "state": str(agent.engine.state)}

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics(agent: AgentDep) -> Response:
        return Response(generate_latest(agent.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/info", tags=["agent"])
    def info(agent: AgentDep) -> AgentInfo:
        result: AgentInfo = agent.info()
        return result

    @app.post(
        "/v1/infer",
        tags=["serving"],
        responses={
            503: {"description": "This engine serves no generation (problem+json)"},
            **PROBLEM_RESPONSES,
        },
    )
    async def infer(body: InferRequest, agent: AgentDep) -> InferResponse:
        hidden = agent.config.hidden_size
        if any(len(row) != hidden for row in body.tokens):
            raise Problem(
                422, "Invalid request", f"every token needs {hidden} values", _typed("invalid_request")
            )
        try:
            future = agent.engine.submit(torch.tensor(body.tokens, dtype=torch.float32))
            result = await asyncio.wrap_future(future)
        except EngineUnavailable as exc:
            raise Problem(
                503, "Engine unavailable", str(exc), _typed("unavailable"), code="unavailable"
            ) from exc
        return InferResponse(
            outputs=result.outputs.tolist(), generation=result.generation, rank=result.rank, step=result.step
        )

    def _accepted(status: ReconfigStatus) -> JSONResponse:
        return JSONResponse(status.model_dump(mode="json"), status_code=202)

    reconfig_responses = {202: {"model": ReconfigStatus}, **PROBLEM_RESPONSES}

    @app.post("/v1/reconfig/prepare", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    def prepare(body: PrepareRequest, agent: AgentDep) -> JSONResponse:
        return _accepted(agent.executor.prepare(body))

    @app.post("/v1/reconfig/sync", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    def sync(body: JobRef, agent: AgentDep) -> JSONResponse:
        return _accepted(agent.executor.sync(body.job_id))

    @app.post("/v1/reconfig/pause", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    def pause(body: PauseRequest, agent: AgentDep) -> JSONResponse:
        return _accepted(agent.executor.pause(body.job_id, body.lease_s))

    @app.post("/v1/reconfig/switch", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    def switch(body: JobRef, agent: AgentDep) -> JSONResponse:
        return _accepted(agent.executor.switch(body.job_id))

    @app.post("/v1/reconfig/resume", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    def resume(body: JobRef, agent: AgentDep) -> JSONResponse:
        return _accepted(agent.executor.resume(body.job_id))

    @app.post("/v1/reconfig/abort", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    def abort(body: JobRef, agent: AgentDep) -> JSONResponse:
        return _accepted(agent.executor.abort(body.job_id))

    @app.get(
        "/v1/reconfig",
        tags=["reconfig"],
        responses={404: {"description": "No reconfiguration yet (problem+json)"}},
    )
    def reconfig_status(agent: AgentDep) -> ReconfigStatus:
        status: ReconfigStatus | None = agent.executor.status()
        if status is None:
            raise Problem(
                404, "Not found", "no reconfiguration has run on this agent", _typed("no_job"), code="no_job"
            )
        return status

    @app.get("/v1/cleanup", tags=["cleanup"])
    def cleanup_status(agent: AgentDep) -> CleanupStatus:
        result: CleanupStatus = agent.cleanup.status()
        return result

    @app.post("/v1/cleanup/retry", tags=["cleanup"], status_code=202, responses=PROBLEM_RESPONSES)
    def cleanup_retry(agent: AgentDep) -> JSONResponse:
        if not agent.cleanup.retry():
            raise Problem(
                409,
                "Conflict",
                "no failed cleanup to retry",
                _typed("no_cleanup_failure"),
                code="no_cleanup_failure",
            )
        return JSONResponse(agent.cleanup.status().model_dump(mode="json"), status_code=202)

    @app.post("/v1/cleanup/acknowledge", tags=["cleanup"], responses=PROBLEM_RESPONSES)
    def cleanup_acknowledge(agent: AgentDep) -> CleanupStatus:
        if agent.cleanup.acknowledge() is None:
            raise Problem(
                409,
                "Conflict",
                "no failed cleanup to acknowledge",
                _typed("no_cleanup_failure"),
                code="no_cleanup_failure",
            )
        result: CleanupStatus = agent.cleanup.status()
        return result

    @app.post(
        "/v1/faults",
        tags=["testing"],
        responses={404: {"description": "Fault injection is not enabled (problem+json)"}},
    )
    def faults(body: FaultInjection, agent: AgentDep) -> FaultInjection:
        if not agent.settings.enable_fault_injection:
            raise Problem(404, "Not found", "fault injection is not enabled on this agent")
        agent.executor.inject(body)
        return body

    return app
