"""The coordinator's ASGI app. `create_app(settings)` builds one; `app` is what `uvicorn app.main:app`
and `epctl serve` run. Importing never touches the database: connecting, migrating to head and
creating the first admin token happen at start-up (lifespan), where bad configuration stops it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app import metrics
from app.api import health
from app.core.config import Settings, load_settings
from app.core.db import make_engine, migrate_to_head
from app.core.problems import PROBLEM_MEDIA_TYPE, install_problem_handlers
from app.dashboard.router import router as dashboard_router
from app.deployments.router import router as deployments_router
from app.engines.router import router as engines_router
from app.hooks.router import router as hooks_router
from app.jobs.cleanup_router import router as cleanup_router
from app.jobs.events_router import router as events_router
from app.jobs.lifespan import run_jobs
from app.jobs.router import router as jobs_router
from app.tokens.router import router as tokens_router
from app.tokens.service import ensure_first_admin
from app.webhooks.delivery import delivery_worker
from app.webhooks.router import router as webhooks_router

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
    if settings.auto_migrate:
        migrate_to_head(settings.database_url)
    engine = make_engine(settings.database_url, busy_timeout_ms=settings.db_busy_timeout_ms)
    env_secret = settings.admin_token.get_secret_value() if settings.admin_token else None
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
                        if PROBLEM_MEDIA_TYPE in content:
                            content.pop("application/json", None)
        return app.openapi_schema or generate()

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        resolved = settings or load_settings()  # ConfigError here stops start-up with its message
        engine, generated = start_database(resolved)
        if generated is not None:
            announce_admin_token(generated)
        app.state.settings = resolved
        app.state.db_engine = engine
        try:
            async with run_jobs(app), delivery_worker(engine, resolved):  # job runner, webhook delivery
                yield
        finally:
            engine.dispose()

    app = FastAPI(
        title="epctl coordinator",
        summary="Elastic expert-parallel reconfiguration control plane",
        version=API_VERSION,
        openapi_tags=TAGS,
        generate_unique_id_function=operation_id,
        lifespan=lifespan,
    )
    install_problem_handlers(app)
    _problems_only_as_problem_json(app)
    app.include_router(health.router)
    app.include_router(deployments_router)
    app.include_router(engines_router)
    app.include_router(jobs_router)
    app.include_router(cleanup_router)
    app.include_router(tokens_router)
    app.include_router(events_router)
    app.include_router(webhooks_router)
    app.include_router(hooks_router)
    app.include_router(metrics.router)
    app.include_router(dashboard_router)  # /ui (static, not in the OpenAPI document)
    return app


app = create_app()
