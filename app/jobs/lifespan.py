"""Starts the job runner with the coordinator (`async with run_jobs(app): ...` in the app lifespan)."""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.core.config import Settings
from app.jobs.runner import JobRunner, RunnerSettings, load_runner_settings
from app.launchers.local import LocalLauncher
from app.launchers.static import StaticLauncher
from app.tokens.models import TokenRole
from app.tokens.service import authenticate, create_token

AGENT_TOKEN_FILE = "local-agent-token"


def ensure_agent_token(db: DbEngine, state_dir: Path) -> str:
    """The operator token locally launched agents register with: kept in the state directory (0600)
    and reused across restarts while it is valid."""
    path = state_dir / AGENT_TOKEN_FILE
    with Session(db, expire_on_commit=False) as session:
        if path.exists():
            secret = path.read_text().strip()
            if secret and authenticate(session, secret=secret) is not None:
                return secret
        from app.core.ids import new_ulid

        _, secret = create_token(
            session,
            name=f"local-agents-{new_ulid().lower()}",
            role=TokenRole.operator,
            created_by="coordinator",
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret)
    return secret


def build_runner(
    settings: Settings, db: DbEngine, runner_settings: RunnerSettings | None = None
) -> JobRunner:
    runner_settings = runner_settings or load_runner_settings()
    state_dir = runner_settings.state_dir or settings.data_dir
    updates: dict[str, object] = {"state_dir": state_dir}
    if not runner_settings.public_url:
        updates["public_url"] = f"http://{settings.host}:{settings.port}"
    if not runner_settings.agent_token:
        updates["agent_token"] = ensure_agent_token(db, Path(state_dir))
    return JobRunner(
        db,
        launchers={
            "local": LocalLauncher(
                Path(state_dir), executable=shlex.split(runner_settings.local_agent_command) or None
            ),
            "static": StaticLauncher(),
        },
        lease_s=settings.job_lease_s,
        settings=runner_settings.model_copy(update=updates),
    )


@contextlib.asynccontextmanager
async def run_jobs(app: FastAPI) -> AsyncIterator[JobRunner | None]:
    """Run jobs while the app serves. Locally launched agents outlive a coordinator restart on
    purpose: the next coordinator reconciles with them (`epctl up` stops them when it exits)."""
    runner_settings = load_runner_settings()
    if not runner_settings.enabled:
        yield None
        return
    runner = build_runner(app.state.settings, app.state.db_engine, runner_settings)
    app.state.job_runner = runner
    await runner.start()
    try:
        yield runner
    finally:
        await runner.stop()
