"""Starts the job runner with the coordinator (`async with run_jobs(app): ...` in the app lifespan), and
puts the backends on the app (`app.state.backends`) for the deployments API."""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.agents.fleet import Fleet
from app.backends.base import BackendContext, Backends
from app.backends.registry import builtin_backends
from app.core.config import Settings
from app.core.runner_settings import RunnerSettings, load_runner_settings
from app.launchers.base import Launcher
from app.launchers.local import LocalLauncher
from app.launchers.state_lock import hold_state_dir, holds_state_dir
from app.launchers.static import StaticLauncher
from app.runner.loop import JobRunner
from app.runner.scheduled import Retention
from app.tokens.models import TokenRole
from app.tokens.service import authenticate, create_token

AGENT_TOKEN_FILE = "local-agent-token"

BackendsOf = Callable[[BackendContext], Backends]  # the registry (`app.backends.registry`), configured


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
    settings: Settings,
    db: DbEngine,
    runner_settings: RunnerSettings | None = None,
    extra_launchers: Mapping[str, Launcher] | None = None,
    backends: BackendsOf = builtin_backends,
) -> JobRunner:
    """The runner with the built-in launchers (`local`, `static`) and any others given (`ray`), and the
    backends `backends` makes (default: the built-in ones, without a local vLLM launcher)."""
    runner_settings = runner_settings or load_runner_settings()
    state_dir = runner_settings.state_dir or settings.data_dir
    updates: dict[str, object] = {"state_dir": state_dir}
    if not runner_settings.public_url:
        updates["public_url"] = settings.base_url
    if not runner_settings.agent_token:
        updates["agent_token"] = ensure_agent_token(db, Path(state_dir))
    if not runner_settings.coordinator_id and holds_state_dir(Path(state_dir)):
        # One coordinator per data directory (`hold_state_dir`), so its name can outlive the process:
        # a restarted coordinator claims the jobs it held before at once instead of waiting out the lease.
        updates["coordinator_id"] = f"{socket.gethostname()}:{Path(state_dir).resolve()}"
    return JobRunner(
        db,
        launchers={
            "local": LocalLauncher(
                Path(state_dir),
                # The operator's launch deadline: the launcher's own 30 s default silently capped it
                # (agents not ready within 30 s on a loaded 2-core host failed every scale-up).
                ready_timeout_s=runner_settings.launch_deadline_s,
                executable=shlex.split(runner_settings.local_agent_command) or None,
                orphan_grace_s=runner_settings.local_agent_orphan_grace_s,
                host=runner_settings.local_agent_host,
                data_host=runner_settings.local_agent_data_host,
                zygote=runner_settings.local_agent_zygote or None,
            ),
            "static": StaticLauncher(),
            **(extra_launchers or {}),
        },
        lease_s=settings.job_lease_s,
        agent_timeout_s=settings.agent_timeout_s,
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        settings=runner_settings.model_copy(update=updates),
        retention=Retention(settings, settings.retention_interval_s),
        backends=backends,
    )


@contextlib.asynccontextmanager
async def run_jobs(
    app: FastAPI,
    extra_launchers: Mapping[str, Launcher] | None = None,
    backends: BackendsOf = builtin_backends,
) -> AsyncIterator[JobRunner | None]:
    """Run jobs while the app serves. Locally launched agents outlive a coordinator restart on
    purpose: the next coordinator reconciles with them (`epctl up` stops them when it exits).
    `extra_launchers` (the cluster launchers) and what `backends` holds (the local vLLM launcher) are
    owned by the caller, which shuts them down. With the runner off, the backends still hear of
    deployments (no launcher of engines)."""
    runner_settings = load_runner_settings()
    if not runner_settings.enabled:
        db = app.state.db_engine
        context = BackendContext(db, runner_settings.coordinator_id, runner_settings, {}, Fleet)
        app.state.backends = backends(context)
        yield None
        return
    # The local launcher's agents are this data directory's: refuse to share it (DataDirInUseError).
    hold_state_dir(runner_settings.state_dir or app.state.settings.data_dir, holder="coordinator")
    runner = build_runner(app.state.settings, app.state.db_engine, runner_settings, extra_launchers, backends)
    app.state.job_runner = runner
    app.state.backends = runner.backends
    await runner.start()
    try:
        yield runner
    finally:
        # `epctl up` stops its engines after the coordinator: a job handed over could never finish.
        await runner.stop(end_jobs=bool(getattr(app.state, "end_jobs_on_stop", False)))
