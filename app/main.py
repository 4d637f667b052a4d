"""The coordinator's ASGI app. `create_app(settings)` builds one; `app` is what `uvicorn app.main:app`
and `epctl serve` run. Importing never touches the database: connecting, migrating to head and
creating the first admin token happen at start-up (lifespan), where bad configuration stops it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from alembic import command
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.telemetry import TelemetryConfig
from sqlalchemy.engine import Engine, make_url
from sqlmodel import Session

from app import metrics
from app.agents.transport import use_agent_ca
from app.api import docs, health
from app.api.database import Database
from app.api.deps import AuthGuard, PrincipalCache
from app.backends.reference.cleanup_router import router as cleanup_router
from app.backends.registry import builtin_backends
from app.backends.vllm.lifespan import vllm_backend
from app.backends.vllm.router import router as vllm_engine_router
from app.core.auth import Permission
from app.core.clock import utc_now
from app.core.config import Settings, load_settings
from app.core.db import alembic_config, make_engine, start_lock
from app.core.heap import frozen_heap
from app.core.limits import Limits, RequestLimits
from app.core.private_files import keep_new_files_private
from app.core.problems import install_problem_handlers, problem_responses
from app.core.runner_settings import load_runner_settings
from app.core.shedding import SHED_HEARTBEATS, bearer_secret, retry_after_s
from app.dashboard.router import router as dashboard_router
from app.deployments.companions import DeploymentCompanions
from app.deployments.engines.batch import HeartbeatBatches
from app.deployments.engines.fast_path import HeartbeatFastPath
from app.deployments.engines.router import router as engines_router
from app.deployments.incidents.router import router as incidents_router
from app.deployments.router import router as deployments_router
from app.frontdoor.keeper import front_door_keepers
from app.frontdoor.router import router as endpoints_router
from app.frontdoor.settings import load_front_doors
from app.jobs.active import active_job_ids
from app.jobs.deletion import delete_deployment
from app.jobs.event_hub import JobLogHub
from app.jobs.events_router import router as events_router
from app.jobs.router import router as jobs_router
from app.launchers.registry import cluster_launchers
from app.metrics_db import refresh as refresh_metrics
from app.runner.lifespan import run_jobs
from app.scale.desired import desired_publics
from app.scale.hooks.router import router as hooks_router
from app.scale.kube.router import router as kube_router
from app.scale.kube.status import KubernetesStatusErrors
from app.scale.router import router as scale_router
from app.sd.router import router as sd_router
from app.tokens.router import router as tokens_router
from app.tokens.service import ensure_first_admin, hash_token
from app.webhooks.delivery import delivery_worker
from app.webhooks.router import router as webhooks_router
from engine_agent.logs import configure_logging
from engine_agent.throttle import RefusalLog

log = logging.getLogger(__name__)

API_VERSION = "0.1.0"
TAGS = [
    {"name": "deployments", "description": "EP groups of engines and their scaling limits"},
    {"name": "engines", "description": "registered agents, one DP rank each"},
    {"name": "reconfigurations", "description": "scale jobs: create, watch, cancel"},
    {"name": "tokens", "description": "API tokens and their roles"},
    {"name": "health", "description": "liveness and readiness"},
]


def operation_id(route: APIRoute) -> str:
    """`tag-name`, e.g. `reconfigurations-create`: reads well in generated clients."""
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


def start_database(settings: Settings) -> tuple[Engine, str | None]:
    """Migrate (when enabled), connect, and make sure an admin token exists.
    Returns (engine, generated admin secret or None)."""
    engine = make_engine(
        settings.database_url,
        busy_timeout_ms=settings.db_busy_timeout_ms,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout_s=settings.db_pool_timeout_s,
    )
    env_secret = settings.admin_token.get_secret_value() if settings.admin_token else None
    # Coordinators started together on one empty Postgres: one migrates and makes the first admin,
    # the others wait for it, then find the schema at head and the token there.
    with start_lock(settings.database_url):
        if settings.auto_migrate:
            command.upgrade(alembic_config(settings.database_url), "head")
        with Session(engine) as session:
            generated = ensure_first_admin(session, env_secret=env_secret)
    return engine, generated


def announce_admin_token(secret: str) -> None:
    print(
        "\n  epctl: first start - created an admin token (shown once, store it now):\n"
        f"\n      {secret}\n\n"
        "  Use it as `Authorization: Bearer <token>` or EPCTL_TOKEN; set EPCTL_ADMIN_TOKEN to choose it.\n",
        file=sys.stderr,
        flush=True,
    )


def _document_request_limits(app: FastAPI) -> None:
    """Every operation may answer 400/413/414: the request limits (app.core.limits) answer them before
    any handler runs; and every operation that needs a token may answer 429 (`too-many-failed-attempts`:
    the failure throttle, `app.api.deps.AuthGuard`)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for path in schema["paths"].values():
                for operation in path.values():
                    responses = operation.setdefault("responses", {})
                    statuses = (400, 413, 414, 429) if "401" in responses else (400, 413, 414)
                    for status, problem in problem_responses(*statuses).items():
                        documented = {key: value for key, value in problem.items() if key != "model"}
                        responses.setdefault(str(status), documented)
        return app.openapi_schema or generate()

    app.openapi = openapi  # type: ignore[method-assign]


async def _flush_refusals(refusals: RefusalLog) -> None:
    """The summary of a spell of refused calls, once it is over (not only at the next refusal)."""
    while True:
        await asyncio.sleep(refusals.interval_s)
        refusals.flush()


def _heard_shed(app: FastAPI, scope: dict[str, Any], engine_id: str) -> None:
    """A shed heartbeat counts as heard (`app.core.shedding`) when its token is one this coordinator has
    seen valid lately with the engines' permission: no database, no stranger keeping an engine alive."""
    cache: PrincipalCache | None = getattr(app.state, "principal_cache", None)
    settings: Settings | None = getattr(app.state, "settings", None)
    secret = bearer_secret(scope)
    if cache is None or settings is None or not secret:
        return
    # Seen valid within the heartbeat timeout: shed heartbeats alone keep an engine heard that long.
    principal = cache.seen(hash_token(secret), settings.heartbeat_timeout_s)
    if principal is not None and principal.can(Permission.engines):
        SHED_HEARTBEATS.record(engine_id, utc_now())


def _heartbeat_backlog_s(app: FastAPI) -> float:
    """How long the oldest heartbeat waiting for its batch's commit has waited (`app.core.shedding`)."""
    batches: HeartbeatBatches | None = getattr(app.state, "heartbeat_batches", None)
    return batches.backlog_age_s() if batches is not None else 0.0


def _fast_heartbeats(app: FastAPI) -> bool:
    settings: Settings | None = getattr(app.state, "settings", None)
    return settings is not None and settings.heartbeat_fast_path


NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


def create_app(settings: Settings | None = None, *, freeze_heap: bool | None = None) -> FastAPI:
    """Without `settings`, the app reads them from the environment at start-up and, owning the process
    (`uvicorn app.main:app`), sets up its logging; with them, the caller owns the process's logging.
    `freeze_heap` (default: owning the process; `epctl serve` and `epctl up` pass True): once started,
    its objects are kept out of the garbage collector's full passes (`app.core.heap`)."""
    freeze = settings is None if freeze_heap is None else freeze_heap

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        resolved = settings or load_settings()  # ConfigError here stops start-up with its message
        if settings is None:
            configure_logging(resolved.log_format)
            keep_new_files_private()
        use_agent_ca(str(resolved.agent_ca_file) if resolved.agent_ca_file else None)
        engine, generated = start_database(resolved)
        if generated is not None:
            announce_admin_token(generated)
        shown_url = make_url(resolved.database_url).render_as_string(hide_password=True)
        log.info("coordinator started (database %s)", shown_url)
        app.state.settings = resolved
        app.state.db_engine = engine
        app.state.database = database = Database(engine, concurrency=resolved.db_request_concurrency)
        app.state.principal_cache = PrincipalCache(resolved.auth_cache_s)
        app.state.deployment_companions = DeploymentCompanions(
            active_job_ids=active_job_ids,
            desired=desired_publics,
            delete=lambda session, ref: delete_deployment(session, ref=ref),
        )
        app.state.auth_guard = guard = AuthGuard.from_settings(resolved)
        summaries = asyncio.create_task(_flush_refusals(guard.refusals), name="refusal-summaries")
        app.state.job_log_hub = hub = JobLogHub(
            database,
            poll_s=resolved.events_poll_s,
            max_streams=resolved.events_max_streams,
            max_per_token=resolved.events_max_streams_per_token,
        )
        app.state.limits = Limits(
            max_body_bytes=resolved.max_body_bytes,
            max_json_depth=resolved.max_json_depth,
            max_url_bytes=resolved.max_url_bytes,
            max_active_requests=resolved.max_active_requests,
            max_waiting_requests=resolved.max_waiting_requests,
            heartbeat_shed_after_s=resolved.heartbeat_shed_after_s,
            heartbeat_retry_after_s=retry_after_s(resolved.heartbeat_timeout_s),
        )
        # The front doors this coordinator keeps (`epctl up` passes its own HAProxy's).
        doors = getattr(app.state, "front_doors", None)
        front_doors = load_front_doors() if doors is None else doors
        try:
            # Stopped in reverse order. Cluster launchers (Ray) and the local vLLM launcher outlive the
            # runner, which may still release engines as it stops.
            async with (
                vllm_backend(app) as vllm_launcher,
                cluster_launchers(engine) as extra_launchers,
                run_jobs(app, extra_launchers, partial(builtin_backends, vllm_launcher=vllm_launcher)),
                delivery_worker(engine, resolved),
                # The feeds' publisher runs with the job runner (API-only coordinators derive on read).
                front_door_keepers(database, front_doors, publish=load_runner_settings().enabled) as keepers,
            ):
                app.state.front_door_keepers = keepers
                with frozen_heap() if freeze else contextlib.nullcontext():
                    yield
        finally:
            summaries.cancel()
            guard.refusals.flush(force=True)
            await hub.close()
            engine.dispose()

    app = FastAPI(
        title="epctl coordinator",
        summary="Elastic expert-parallel reconfiguration control plane",
        version=API_VERSION,
        openapi_tags=TAGS,
        generate_unique_id_function=operation_id,
        lifespan=lifespan,
        docs_url=None,  # served by app.api.docs from local assets, not a CDN
        redoc_url=None,
        # No OpenTelemetry here: FastAPI's own otherwise asks the global providers (and the environment)
        # on every request whether it is configured (4% of a heartbeat's CPU in-process: issue 37).
        telemetry=NO_TELEMETRY,
    )
    # Steady heartbeats answered ahead of routing (issue 37), inside the input limits below: added first,
    # so it is the innermost middleware.
    heartbeat = next(r for r in engines_router.routes if isinstance(r, APIRoute) and r.name == "heartbeat")
    app.add_middleware(HeartbeatFastPath, route=heartbeat, enabled=partial(_fast_heartbeats, app))
    # Input limits before parsing, routing or authentication (settings resolve at start-up).
    app.add_middleware(
        RequestLimits,
        limits=lambda: getattr(app.state, "limits", Limits()),
        on_shed=partial(_heard_shed, app),
        backlog_age_s=partial(_heartbeat_backlog_s, app),
    )
    app.add_middleware(KubernetesStatusErrors)  # errors under /api, /apis as Kubernetes `Status`
    app.add_middleware(metrics.HttpMetrics)  # outermost: counts the limits' refusals too
    install_problem_handlers(app)  # and documents error responses as problem+json only
    _document_request_limits(app)
    # The engines' routes first: routing tries each router in turn, and the heartbeats are most of the
    # requests (issue 37: 700 a second).
    app.include_router(engines_router)
    app.include_router(health.router)
    app.include_router(deployments_router)
    app.include_router(endpoints_router)
    app.include_router(vllm_engine_router)
    app.include_router(scale_router)
    app.include_router(kube_router)  # kubectl and client-go: discovery, epctl.io/v1 (not in OpenAPI)
    app.include_router(incidents_router)
    app.include_router(jobs_router)
    app.include_router(cleanup_router)
    app.include_router(tokens_router)
    app.include_router(events_router)
    app.include_router(webhooks_router)
    app.include_router(hooks_router)
    app.include_router(sd_router)
    app.include_router(metrics.build_router(refresh_metrics))
    app.include_router(dashboard_router)  # /ui (static, not in the OpenAPI document)
    app.include_router(docs.router)  # /docs (Swagger UI from local assets)
    return app


app = create_app()
