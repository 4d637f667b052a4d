"""The agent's HTTP API. Long operations answer 202 at once and are observed through
`GET /v1/reconfig`, a bounded long-poll (`job_id`, `until`, `wait_s`); an action POST given `wait_s`
answers once its phase is reached instead. Every error is application/problem+json (RFC 9457)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Annotated, Any

import torch
from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine_agent.agent import Agent
from engine_agent.engine import EngineUnavailable
from engine_agent.executor import Conflict, InvalidRequest, ReconfigExecutor
from engine_agent.protocol import (
    LONG_POLL_HEADER,
    MAX_WAIT_S,
    TERMINAL_PHASES,
    AgentInfo,
    CleanupStatus,
    FaultInjection,
    InferRequest,
    InferResponse,
    JobRef,
    PauseRequest,
    PrepareRequest,
    ReconfigPhase,
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

WaitS = Annotated[
    float,
    Query(
        ge=0,
        description="hold the answer until the phase is reached, at most this long "
        f"(capped at {MAX_WAIT_S:g} s); 0 answers at once",
    ),
]
Until = Annotated[
    str | None,
    Query(description="comma-separated phases to wait for (terminal phases and errors always end the wait)"),
]

# Phases in which an error is expected and the wait goes on (the abort or resume then ends it).
_STILL_RECOVERING = frozenset({ReconfigPhase.aborting, ReconfigPhase.resuming})


def _parse_until(until: str | None, default: frozenset[ReconfigPhase]) -> frozenset[ReconfigPhase]:
    if not until:
        return default
    phases: set[ReconfigPhase] = set()
    for name in until.split(","):
        name = name.strip()
        if not name:
            continue
        try:
            phases.add(ReconfigPhase(name))
        except ValueError:
            known = ", ".join(p.value for p in ReconfigPhase)
            raise ProblemError(
                422, "invalid_request", f"until: unknown phase {name!r} (one of {known})"
            ) from None
    return frozenset(phases) or default


def _settled(status: ReconfigStatus, until: frozenset[ReconfigPhase]) -> bool:
    """Nothing more to wait for: the phase asked for, a terminal phase, or an error."""
    return (
        status.phase in until
        or status.phase in TERMINAL_PHASES
        or (status.error is not None and status.phase not in _STILL_RECOVERING)
    )


def _status_of(executor: ReconfigExecutor, job_id: str) -> ReconfigStatus:
    status = executor.status()
    if status is None:
        raise ProblemError(404, "no_job", "no reconfiguration has run on this agent")
    if status.job_id != job_id:
        raise ProblemError(
            409,
            "wrong_job",
            f"job {job_id} is not the job here ({status.job_id})",
            current_job_id=status.job_id,
        )
    return status


async def _wait_until(
    executor: ReconfigExecutor,
    job_id: str,
    until: frozenset[ReconfigPhase],
    wait_s: float,
    *,
    started: ReconfigStatus | None = None,
) -> ReconfigStatus:
    """Job `job_id`'s status once settled (see `_settled`) or after `wait_s`. The executor's threads
    wake this coroutine through the event loop; nothing blocks the loop meanwhile. With `started`
    (an action's own answer), a job that vanished meanwhile answers that instead of an error."""
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def wake() -> None:
        loop.call_soon_threadsafe(changed.set)

    executor.add_watcher(wake)
    try:
        give_up = loop.time() + min(wait_s, MAX_WAIT_S)
        while True:
            changed.clear()  # before reading: a change after the read sets it again
            if started is None:
                status = _status_of(executor, job_id)
            else:
                current = executor.status()
                status = current if current is not None and current.job_id == job_id else started
            remaining = give_up - loop.time()
            if _settled(status, until) or remaining <= 0:
                return status
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)
    finally:
        executor.remove_watcher(wake)


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

    long_poll_headers = {LONG_POLL_HEADER: f"{MAX_WAIT_S:g}"}

    async def _accepted(
        agent: Agent,
        action: Callable[[], ReconfigStatus],
        wait_s: float,
        until: str | None,
        end_phase: ReconfigPhase,
        *,
        inline: bool = False,
    ) -> JSONResponse:
        """Run the action, then, with `wait_s`, hold the answer until its end phase (or `until`) is
        reached. `inline`: the action only touches the executor's own state (briefly, under its lock)
        and runs on the event loop, saving a thread hop inside the commit window; otherwise it may
        call into the engine and runs in the thread pool."""
        phases = _parse_until(until, frozenset({end_phase}))
        status = action() if inline else await run_in_threadpool(action)
        if wait_s > 0 and not _settled(status, phases):
            status = await _wait_until(agent.executor, status.job_id, phases, wait_s, started=status)
        return JSONResponse(status.model_dump(mode="json"), status_code=202, headers=long_poll_headers)

    reconfig_responses = {202: {"model": ReconfigStatus}, **PROBLEM_RESPONSES}

    @app.post("/v1/reconfig/prepare", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    async def prepare(
        body: PrepareRequest, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None
    ) -> JSONResponse:
        return await _accepted(
            agent, lambda: agent.executor.prepare(body), wait_s, until, ReconfigPhase.prepared
        )

    @app.post("/v1/reconfig/sync", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    async def sync(body: JobRef, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None) -> JSONResponse:
        return await _accepted(
            agent, lambda: agent.executor.sync(body.job_id), wait_s, until, ReconfigPhase.synced, inline=True
        )

    @app.post("/v1/reconfig/pause", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    async def pause(
        body: PauseRequest, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None
    ) -> JSONResponse:
        return await _accepted(
            agent,
            lambda: agent.executor.pause(body.job_id, body.lease_s),
            wait_s,
            until,
            ReconfigPhase.paused,
            inline=True,
        )

    @app.post("/v1/reconfig/switch", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    async def switch(body: JobRef, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None) -> JSONResponse:
        return await _accepted(
            agent,
            lambda: agent.executor.switch(body.job_id),
            wait_s,
            until,
            ReconfigPhase.committed,
            inline=True,
        )

    @app.post("/v1/reconfig/resume", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    async def resume(body: JobRef, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None) -> JSONResponse:
        return await _accepted(
            agent,
            lambda: agent.executor.resume(body.job_id),
            wait_s,
            until,
            ReconfigPhase.resumed,
            inline=True,
        )

    @app.post("/v1/reconfig/abort", tags=["reconfig"], status_code=202, responses=reconfig_responses)
    async def abort(body: JobRef, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None) -> JSONResponse:
        return await _accepted(
            agent, lambda: agent.executor.abort(body.job_id), wait_s, until, ReconfigPhase.aborted
        )

    @app.get(
        "/v1/reconfig",
        tags=["reconfig"],
        responses=problem_responses(404, 409, 422),
    )
    async def reconfig_status(
        agent: AgentDep,
        response: Response,
        job_id: Annotated[
            str | None, Query(description="the job asked about; another job here answers 409 wrong_job")
        ] = None,
        until: Until = None,
        wait_s: WaitS = 0.0,
    ) -> ReconfigStatus:
        """The current (or last) reconfiguration. With `job_id` and `wait_s`: a bounded long-poll that
        answers as soon as that job is in one of `until`, terminal, or failed, else after `wait_s`."""
        response.headers.update(long_poll_headers)
        executor = agent.executor
        if job_id is None:
            if wait_s > 0:
                raise ProblemError(422, "invalid_request", "wait_s needs job_id")
            status: ReconfigStatus | None = executor.status()
            if status is None:
                raise ProblemError(404, "no_job", "no reconfiguration has run on this agent")
            return status
        phases = _parse_until(until, frozenset())
        if wait_s <= 0:
            return _status_of(executor, job_id)
        return await _wait_until(executor, job_id, phases, wait_s)

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
