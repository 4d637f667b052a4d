"""The agent's HTTP API. Long operations answer 202 at once and are observed by polling
`GET /v1/reconfig`; every error is application/problem+json (RFC 9457)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Annotated, Any

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
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


class ProblemError(Exception):
    """Raised in a route: answered as problem+json with `type` urn:epctl:problem:<code>."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.extra = status, code, detail, extra


TYPE_PREFIX = "urn:epctl:problem:"


def problem_response(request: Request, problem: ProblemError) -> JSONResponse:
    body = {
        "type": TYPE_PREFIX + problem.code,
        "title": HTTPStatus(problem.status).phrase,
        "status": problem.status,
        "detail": problem.detail,
        "instance": request.url.path,
        "code": problem.code,
        **problem.extra,
    }
    return JSONResponse(body, status_code=problem.status, media_type=PROBLEM)


class Problem(BaseModel):
    """application/problem+json (RFC 9457). `code` repeats the type's last part; extra members vary."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["urn:epctl:problem:wrong_phase"])
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    code: str


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries declaring problem+json for these statuses."""
    return {
        status: {
            "model": Problem,
            "description": HTTPStatus(status).phrase,
            "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


PROBLEM_RESPONSES = problem_responses(409, 422)


def get_agent(request: Request) -> Agent:
    agent = getattr(request.app.state, "agent", None)
    if not isinstance(agent, Agent):
        raise ProblemError(503, "starting", "the agent is still starting")
    return agent


AgentDep = Annotated[Agent, Depends(get_agent)]


def _problems_only_as_problem_json(app: FastAPI) -> None:
    """Error responses are documented as application/problem+json only (FastAPI adds application/json)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for path in schema["paths"].values():
                for operation in path.values():
                    for response in operation.get("responses", {}).values():
                        content = response.get("content", {})
                        if PROBLEM in content:
                            content.pop("application/json", None)
        return app.openapi_schema or generate()

    app.openapi = openapi  # type: ignore[method-assign]


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

    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(request, exc)

    @app.exception_handler(Conflict)
    async def _conflict(request: Request, exc: Conflict) -> JSONResponse:
        return problem_response(request, ProblemError(409, exc.type, str(exc)))

    @app.exception_handler(InvalidRequest)
    async def _invalid(request: Request, exc: InvalidRequest) -> JSONResponse:
        return problem_response(
            request,
            ProblemError(422, "invalid_request", str(exc)),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        return problem_response(
            request,
            ProblemError(422, "invalid_request", detail, errors=errors),
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem_response(
            request,
            ProblemError(
                exc.status_code, HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_"), str(exc.detail)
            ),
        )

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
        responses=problem_responses(422, 503),
    )
    async def infer(body: InferRequest, agent: AgentDep) -> InferResponse:
        hidden = agent.config.hidden_size
        if any(len(row) != hidden for row in body.tokens):
            raise ProblemError(422, "invalid_request", f"every token needs {hidden} values")
        try:
            future = agent.engine.submit(torch.tensor(body.tokens, dtype=torch.float32))
            result = await asyncio.wrap_future(future)
        except EngineUnavailable as exc:
            raise ProblemError(503, "unavailable", str(exc)) from exc
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
        responses=problem_responses(404),
    )
    def reconfig_status(agent: AgentDep) -> ReconfigStatus:
        status: ReconfigStatus | None = agent.executor.status()
        if status is None:
            raise ProblemError(404, "no_job", "no reconfiguration has run on this agent")
        return status

    @app.get("/v1/cleanup", tags=["cleanup"])
    def cleanup_status(agent: AgentDep) -> CleanupStatus:
        result: CleanupStatus = agent.cleanup.status()
        return result

    @app.post("/v1/cleanup/retry", tags=["cleanup"], status_code=202, responses=PROBLEM_RESPONSES)
    def cleanup_retry(agent: AgentDep) -> JSONResponse:
        if not agent.cleanup.retry():
            raise ProblemError(409, "no_cleanup_failure", "no failed cleanup to retry")
        return JSONResponse(agent.cleanup.status().model_dump(mode="json"), status_code=202)

    @app.post("/v1/cleanup/acknowledge", tags=["cleanup"], responses=PROBLEM_RESPONSES)
    def cleanup_acknowledge(agent: AgentDep) -> CleanupStatus:
        if agent.cleanup.acknowledge() is None:
            raise ProblemError(409, "no_cleanup_failure", "no failed cleanup to acknowledge")
        result: CleanupStatus = agent.cleanup.status()
        return result

    @app.post(
        "/v1/faults",
        tags=["testing"],
        responses=problem_responses(404, 422),
    )
    def faults(body: FaultInjection, agent: AgentDep) -> FaultInjection:
        if not agent.settings.enable_fault_injection:
            raise ProblemError(
                404, "fault_injection_disabled", "fault injection is not enabled on this agent"
            )
        agent.executor.inject(body)
        return body

    _problems_only_as_problem_json(app)
    return app
