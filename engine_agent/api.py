"""The agent's ASGI app: the routes (`engine_agent.routes`), problem+json for every error (RFC 9457,
`engine_agent.problems`), and the lifespan that builds the agent. Long operations answer 202 and are
observed through `GET /v1/reconfig`, a bounded long-poll; an action POST given `wait_s` answers once
its phase is reached instead (see `protocol.py`)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from engine_agent.agent import Agent
from engine_agent.auth import require_control_key, require_data_key
from engine_agent.docs import docs_router
from engine_agent.gate import AgentGate, Guard
from engine_agent.problems import install_problem_handlers, problem_response, problem_responses
from engine_agent.reconfig import Conflict, InvalidRequest
from engine_agent.routes import cleanup, faults, generation, health, infer, info, reconfig
from engine_agent.routes import keys as keys_route
from engine_agent.settings import AgentSettings
from engine_agent.throttle import FailureThrottle, RefusalLog

log = logging.getLogger(__name__)

FAULT_INJECTION_ENV = "EPCTL_AGENT_ENABLE_FAULT_INJECTION"


async def _conflict(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Conflict)
    return problem_response(request, status=409, code=exc.type, detail=str(exc))


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    return problem_response(request, status=422, code="invalid-request", detail=str(exc))


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


def _fault_injection_wanted(settings: AgentSettings | None) -> bool:
    if settings is not None:
        return settings.enable_fault_injection
    return os.environ.get(FAULT_INJECTION_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def create_app(
    settings: AgentSettings | None = None,
    *,
    url: str | None = None,
    agent_factory: Callable[[AgentSettings, str], Agent] | None = None,
    fault_injection: bool | None = None,
) -> FastAPI:
    """The agent's ASGI app. Nothing starts until the app's lifespan runs (serving it): building the
    app (for the OpenAPI document, or at import of engine_agent.main) is cheap.

    Every route but `/healthz`, `/metrics`, the API docs and `/v1/infer` needs the agent key
    (`engine_agent.auth`), checked from the headers before routing by `engine_agent.gate`; `/v1/infer`
    needs the data key when one is set. The test-only `/v1/faults` exists only with `fault_injection`
    (default: the settings' `enable_fault_injection`): otherwise it is a 404."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        resolved = settings or AgentSettings()
        advertised = url or resolved.served_url(resolved.port)
        factory = agent_factory or Agent
        if (refusal := resolved.missing_key()) is not None:
            raise RuntimeError(refusal)
        if resolved.key is None:
            log.warning(
                "started with --insecure-no-agent-key: anyone who reaches %s can pause, abort or "
                "reconfigure this engine (development only)",
                advertised,
            )
        agent = await asyncio.to_thread(factory, resolved, advertised)
        guard = Guard(
            agent.keys,
            throttle=FailureThrottle(
                burst=resolved.auth_failure_burst, refill_s=resolved.auth_failure_refill_s
            ),
            refusals=RefusalLog(logging.getLogger("engine_agent.auth")),
        )
        guard.register(agent.metrics.registry)
        await asyncio.to_thread(_trust_the_launcher, guard, resolved)
        app.state.guard = guard
        app.state.agent = agent
        log.info("agent %s serving at %s (store %s)", agent.engine_id, advertised, agent.store_address)
        summaries = asyncio.create_task(_flush_refusals(guard.refusals), name="refusal-summaries")
        try:
            yield
        finally:
            summaries.cancel()
            guard.refusals.flush(force=True)
            await asyncio.to_thread(agent.close)

    app = FastAPI(
        title="epctl engine agent",
        version="1",
        summary="One engine's agent: reference MoE serving and the reconfiguration executor",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        docs_url=None,  # served from local assets below, not a CDN
        redoc_url=None,
    )
    # Outermost: every call is decided from its headers before routing or reading its body.
    app.add_middleware(AgentGate, guard_of=lambda: getattr(app.state, "guard", None))
    install_problem_handlers(app)
    app.add_exception_handler(Conflict, _conflict)
    app.add_exception_handler(InvalidRequest, _invalid)
    app.include_router(health.router)  # open: liveness and metrics (no secret in either)
    app.include_router(docs_router("epctl engine agent - API"))  # open: the document holds no secret
    # Every keyed route documents the gate's answers: 401 (no or wrong key), 429 (too many of those).
    refused = problem_responses(401, 429)
    app.include_router(infer.router, dependencies=[Depends(require_data_key)], responses=refused)
    control = [Depends(require_control_key)]
    bounded = {**refused, **problem_responses(413)}  # control bodies are bounded (engine_agent.gate)
    for routes in (info, generation, reconfig, cleanup, keys_route):
        app.include_router(routes.router, dependencies=control, responses=bounded)
    if fault_injection if fault_injection is not None else _fault_injection_wanted(settings):
        app.include_router(faults.router, dependencies=control, responses=bounded)
    return app


def _trust_the_launcher(guard: Guard, settings: AgentSettings) -> None:
    """The key this agent was started with counts as proven from its coordinators' addresses: a guesser
    sharing such an address (the coordinator's host) cannot keep the coordinator out of an agent it has
    not called yet (a joiner) by running the address's failures out first (`engine_agent.throttle`)."""
    current = guard.keys.current_digest()
    if current is None:
        return
    for url in settings.coordinator_urls():
        host = urlsplit(url).hostname
        if not host:
            continue
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            continue  # not resolvable now: the coordinator proves the key at its first call
        for address in {str(found[4][0]) for found in infos}:
            guard.throttle.succeeded(address, current)


async def _flush_refusals(refusals: RefusalLog) -> None:
    """The summary of a spell of refusals, once it is over (not only at the next refusal)."""
    while True:
        await asyncio.sleep(refusals.interval_s)
        refusals.flush()
