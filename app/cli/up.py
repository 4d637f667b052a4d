"""`epctl up`: the coordinator on SQLite plus a local deployment `demo` of two reference engines.

Starts the coordinator in this process (uvicorn, 127.0.0.1), creates the deployment with the local
launcher if it does not exist, scales it to two engines through the API and waits for that job, then
prints the URL, an admin token and curl commands to scale it. Ctrl-C stops the coordinator and every
agent it launched (the deployment is left at size 0, so the next `epctl up` starts it afresh).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from app.core.config import ConfigError, Settings, load_settings

DEMO = "demo"
DEMO_ENGINES = 2


def up(
    port: Annotated[int, typer.Option(help="port of the coordinator on 127.0.0.1")] = 8000,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="where the SQLite file and agent logs live (default EPCTL_DATA_DIR or .data)"),
    ] = None,
    engines: Annotated[int, typer.Option(help="engines of the demo deployment", min=1, max=8)] = DEMO_ENGINES,
) -> None:
    """Run the coordinator (SQLite) and a local deployment `demo` of reference engines."""
    overrides: dict[str, object] = {"host": "127.0.0.1", "port": port}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    try:
        settings = load_settings(**overrides)
    except ConfigError as exc:
        typer.echo(f"epctl up: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        asyncio.run(_run(settings, engines))
    except KeyboardInterrupt:
        pass
    finally:
        _stop_engines(settings)
    typer.echo("epctl up: stopped the coordinator and its engines.", err=True)


async def _run(settings: Settings, engines: int) -> None:
    import uvicorn

    from app.main import create_app

    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    setup = asyncio.create_task(_set_up(server, settings, engines))
    try:
        done, _ = await asyncio.wait({serving, setup}, return_when=asyncio.FIRST_COMPLETED)
        if setup in done and setup.exception() is not None:
            typer.echo(f"epctl up: {setup.exception()}", err=True)
            server.should_exit = True
        await serving
    finally:
        setup.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await setup


async def _set_up(server: Any, settings: Settings, engines: int) -> None:
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    url = f"http://{settings.host}:{settings.port}"
    token = await asyncio.to_thread(_session_admin_token, settings)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0) as api:
        found = await api.get(f"/v1/deployments/{DEMO}")
        if found.status_code == 404:
            created = await api.post(
                "/v1/deployments",
                json={"name": DEMO, "launcher": "local", "min_dp_size": 1, "max_dp_size": 8},
            )
            created.raise_for_status()
            deployment = created.json()
        else:
            found.raise_for_status()
            deployment = found.json()
        if deployment["current_dp_size"] != engines:
            typer.echo(f"epctl up: starting {engines} reference engines for deployment {DEMO} ...", err=True)
            started = time.monotonic()
            requested = await api.post(
                "/v1/reconfigurations",
                json={"deployment": DEMO, "target_dp_size": engines, "source": "cli", "reason": "epctl up"},
            )
            if requested.status_code == 409 and requested.json().get("active_job_id"):
                job_id = requested.json()["active_job_id"]
            else:
                requested.raise_for_status()
                job_id = requested.json()["id"]
            job = await _wait(api, job_id)
            if job["state"] != "succeeded":
                raise RuntimeError(
                    f"starting the engines failed: job {job_id} {job['state']}: {job.get('error')}"
                )
            typer.echo(
                f"epctl up: {engines} engines serving after {time.monotonic() - started:.1f} s", err=True
            )
    _print_welcome(url, token, settings, engines)


async def _wait(api: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    while True:
        response = await api.get(f"/v1/reconfigurations/{job_id}")
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        if job["terminal"]:
            return job
        await asyncio.sleep(0.2)


def _session_admin_token(settings: Settings) -> str:
    """An admin token for this session (the first admin token is shown only once, at first start)."""
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value()
    from sqlmodel import Session

    from app.core.db import make_engine
    from app.core.ids import new_ulid
    from app.tokens.models import TokenRole
    from app.tokens.service import create_token

    engine = make_engine(settings.database_url)
    try:
        with Session(engine) as session:
            _, secret = create_token(
                session, name=f"epctl-up-{new_ulid().lower()}", role=TokenRole.admin, created_by="epctl up"
            )
    finally:
        engine.dispose()
    return secret


def _print_welcome(url: str, token: str, settings: Settings, engines: int) -> None:
    bigger = min(engines * 2, 8)
    curl = 'curl -s -H "Authorization: Bearer $EPCTL_TOKEN"'
    lines = [
        "",
        f"  epctl up: coordinator at {url} (database {settings.database_url})",
        f"  deployment {DEMO}: {engines} reference engines serving; dashboard {url}/ui",
        "",
        f"  export EPCTL_URL={url}",
        f"  export EPCTL_TOKEN={token}",
        "",
        f"  # scale {DEMO} to {bigger} engines (202 + Location of the job):",
        f"  {curl} -X POST $EPCTL_URL/v1/reconfigurations -H 'Content-Type: application/json' \\",
        f'       -d \'{{"deployment": "{DEMO}", "target_dp_size": {bigger}}}\'',
        "  # the job: state, progress, phases with start/end, per-engine results, downtime_ms:",
        f"  {curl} $EPCTL_URL/v1/reconfigurations/<job id>",
        f"  # back to {engines}:",
        f"  {curl} -X POST $EPCTL_URL/v1/reconfigurations -H 'Content-Type: application/json' \\",
        f'       -d \'{{"deployment": "{DEMO}", "target_dp_size": {engines}}}\'',
        f"  # or: epctl scale {DEMO} {bigger} --wait",
        "",
        "  Ctrl-C stops the coordinator and its engines.",
        "",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


def _stop_engines(settings: Settings) -> None:
    """Stop every agent the local launcher started and record the demo deployment as stopped."""
    from sqlmodel import Session, select

    from app.core.clock import utc_now
    from app.core.db import make_engine
    from app.deployments.models import Deployment
    from app.engines.models import Engine, EngineState
    from app.jobs.runner import load_runner_settings
    from app.launchers.local import LocalLauncher

    state_dir = settings.data_dir
    with contextlib.suppress(Exception):  # bad runner settings: the default directory
        state_dir = load_runner_settings().state_dir or settings.data_dir
    stopped = LocalLauncher(Path(state_dir)).stop_all()
    engine = make_engine(settings.database_url)
    try:
        with Session(engine) as session:
            for deployment in session.exec(select(Deployment).where(Deployment.launcher == "local")).all():
                rows = session.exec(
                    select(Engine).where(
                        Engine.deployment_id == deployment.id, Engine.state != EngineState.left.value
                    )
                ).all()
                if not rows and deployment.current_dp_size == 0:
                    continue
                for row in rows:
                    row.state = EngineState.left.value
                    row.dp_rank = None
                    row.updated_at = utc_now()
                    session.add(row)
                deployment.current_dp_size = 0
                deployment.updated_at = utc_now()
                session.add(deployment)
            session.commit()
    except Exception as exc:  # the database may be gone; the processes are what matters
        typer.echo(f"epctl up: could not record the stop in the database: {exc}", err=True)
    finally:
        engine.dispose()
    if stopped:
        typer.echo(f"epctl up: stopped {len(stopped)} agent(s).", err=True)
