"""`epctl up`: the coordinator on SQLite plus a local deployment `demo` of two reference engines.

Starts the coordinator in this process (uvicorn, 127.0.0.1), creates the deployment with the local
launcher if it does not exist, scales it to two engines through the API and waits for that job, then
prints the URL, how to use the admin token and curl commands to scale it. Ctrl-C, SIGTERM and SIGHUP
stop the coordinator (it ends the jobs it runs first: `JobRunner.stop(end_jobs=True)`) and every
agent it launched; the deployment is recorded `stopped` with the size it had (`app.jobs.stop`),
and the next `epctl up` brings it back at that size (or, given `--engines`, at that one, saying so).

The data directory is locked first (`app.launchers.state_lock`): a second `epctl up` on it refuses with
one line and touches nothing. After a crash the agents wait for a coordinator to adopt them
(serving never depends on the coordinator), however long it takes; a restarted `epctl up` adopts the
deployment as it runs (never rescales it, and never stops it because the job the crash interrupted
rolled back), saying `adopted` only once every member answered it
(`app.backends.reference.liveness.adoption`), else what is missing while self-healing makes it
whole. When every engine of the previous run is gone, it starts the deployment again at the size it
had; `epctl down` stops a crashed run's engines instead.

The admin token: `EPCTL_ADMIN_TOKEN` when set; otherwise the first start creates one admin token,
prints it once and keeps it in `<data dir>/admin-token` (mode 0600), and every later `epctl up` reuses
that file instead of minting another token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.cli.down import state_dir, stop_recorded
from app.cli.front_door import agent_tls_ca, open_front_door
from app.cli.heartbeat import Heartbeat
from app.cli.serve import PortUnavailableError, claim_or_close, listening_socket, server_config
from app.cli.welcome import print_welcome

if TYPE_CHECKING:
    import httpx

    from app.core.config import Settings
    from app.frontdoor.launch import RunningDoor
    from app.frontdoor.settings import FrontDoorSpec

DEMO = "demo"
DEMO_ENGINES = 2
# A line at least every 10 s while it starts (`app.cli.heartbeat`): what it is doing, still.
_beat: Heartbeat | None = None


def _doing(what: str | None) -> None:
    if _beat is not None:
        _beat.doing(what)


def up(
    port: Annotated[int, typer.Option(help="port of the coordinator on 127.0.0.1")] = 8000,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="where the SQLite file and agent logs live (default EPCTL_DATA_DIR or .data)"),
    ] = None,
    engines: Annotated[
        int | None,
        typer.Option(
            help=f"engines of the demo deployment when it starts (default: the size it had when it "
            f"stopped, else {DEMO_ENGINES}); a deployment still running from an earlier `epctl up` is "
            "adopted as it is",
            min=1,
            max=8,
        ),
    ] = None,
    front_door_port: Annotated[
        int | None,
        typer.Option(
            help="port of the demo deployment's front door (HAProxy) on 127.0.0.1; default port + 1"
        ),
    ] = None,
    front_door: Annotated[
        bool, typer.Option(help="start a front door (HAProxy) for the demo deployment, when installed")
    ] = True,
) -> None:
    """Run the coordinator (SQLite), a local deployment `demo` of reference engines, and its front
    door (HAProxy) when installed."""
    from app.core.config import ConfigError, load_settings
    from app.core.private_files import keep_new_files_private
    from app.launchers.state_lock import DataDirInUseError
    from engine_agent.logs import configure_logging

    keep_new_files_private()  # the database, token files, pid records and agent logs it writes: 0600
    overrides: dict[str, object] = {"host": "127.0.0.1", "port": port}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    try:
        settings = load_settings(**overrides)
        # Before anything is touched: a port someone else holds stops this one here, in one line, before
        # the data directory or its lock exists; a second `epctl up` on this directory must leave the
        # first alone.
        sock = listening_socket(settings.host, settings.port)
        claim_or_close(settings, sock, holder="epctl up")
    except (ConfigError, DataDirInUseError, PortUnavailableError) as exc:
        typer.echo(f"epctl up: {exc}", err=True)
        raise typer.Exit(2 if isinstance(exc, ConfigError) else 1) from None
    configure_logging(settings.log_format, logging.WARNING)  # a terminal session: warnings and errors only
    global _beat
    typer.echo(f"epctl up: starting the coordinator at {settings.base_url} ...", err=True)
    _beat = Heartbeat("epctl up", lambda line: typer.echo(line, err=True))
    _beat.start("checking the previous run's engines")
    _forget_a_dead_run(settings)
    door: RunningDoor | None = None
    specs: list[FrontDoorSpec] = []
    if front_door:
        door, specs = open_front_door(
            state_dir(settings),
            DEMO,
            front_door_port or settings.port + 1,
            agent_tls_ca(settings.agent_ca_file, os.environ),
        )
    try:
        asyncio.run(_run(settings, engines, sock, specs))
    except KeyboardInterrupt:
        pass
    finally:
        _beat.stop()
        # The cleanup is bounded (SIGKILL after a grace); a second SIGTERM or SIGHUP must not cut it short.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _stop_engines(settings)
        if door is not None:
            door.stop()
    typer.echo("epctl up: stopped the coordinator and its engines.", err=True)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _server_class() -> type[Any]:
    import uvicorn

    class UpServer(uvicorn.Server):
        """uvicorn's server, but SIGINT, SIGTERM and SIGHUP only end `serve()`: uvicorn re-raises the
        signal it caught once it has shut down, which would kill `epctl up` before it stops its
        engines (they would outlive it, orphaned)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            original = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return UpServer


ADMIN_TOKEN_FILE = "admin-token"


async def _run(
    settings: Settings, engines: int | None, sock: socket.socket, doors: list[FrontDoorSpec]
) -> None:
    from app.main import create_app

    _doing("migrating the database")
    token, first = await asyncio.to_thread(_session_admin_token, settings)
    _doing("starting the coordinator (its runner adopts the engines it finds)")
    app = create_app(settings, freeze_heap=True)
    app.state.front_doors = doors
    app.state.end_jobs_on_stop = True  # its engines stop with it: the runner ends its jobs first
    server = _server_class()(server_config(app, settings, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    setup = asyncio.create_task(_set_up(server, app, settings, engines, token, first))
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


async def _set_up(
    server: Any, app: Any, settings: Settings, engines: int | None, token: str, first: bool
) -> None:
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    import httpx  # the coordinator runs in this process: its imports are paid anyway

    from engine_agent.tls import client_context

    url = settings.base_url
    headers = {"Authorization": f"Bearer {token}"}
    # Over HTTPS its own certificate is checked like an agent's (the operator's CA signs both).
    ca_file = str(settings.agent_ca_file) if settings.agent_ca_file else None
    verify = client_context(ca_file)
    _doing(f"reading deployment {DEMO}")
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0, verify=verify) as api:
        deployment = await _demo_deployment(api)
        if deployment["active_job_id"]:
            # A job the previous run left: this coordinator reconciles it; whatever its outcome, the
            # engines that serve stay up (a restart never takes the deployment down).
            job_id = deployment["active_job_id"]
            typer.echo(f"epctl up: finishing job {job_id} left by the previous run ...", err=True)
            job = await _wait(api, job_id)
            typer.echo(f"epctl up: job {job_id} ended {job['state']}", err=True)
            deployment = await _demo_deployment(api)
        size = int(deployment["current_dp_size"])
        if size > 0:
            deployment = await _adopt(api, app, deployment, engines)
            size = int(deployment["current_dp_size"])
        else:
            size, why = start_size(engines, deployment.get("stopped_dp_size"))
            if why:
                typer.echo(f"epctl up: {why}", err=True)
            await _start_engines(api, size)
    _doing(None)
    print_welcome(
        url,
        token if first else None,
        settings,
        size,
        app.state.front_doors,
        deployment=DEMO,
        token_file=admin_token_file(settings),
    )


def start_size(requested: int | None, had: int | None) -> tuple[int, str | None]:
    """The size a deployment at 0 starts at, and the line that says why when it is not the size it had:
    the size it had when it was stopped (`stopped_dp_size`), unless `--engines` asks for another."""
    if had is None:
        return requested or DEMO_ENGINES, None
    if requested is None or requested == had:
        return had, f"bringing deployment {DEMO} back at {had} engines, the size it had when it stopped"
    return requested, f"starting deployment {DEMO} at {requested} engines (--engines), not the {had} it had"


async def _adopt(
    api: httpx.AsyncClient, app: Any, deployment: dict[str, Any], engines: int | None
) -> dict[str, Any]:
    """Say `adopted` only once every recorded member answered this coordinator with the recorded
    generation (`app.backends.reference.liveness.adoption`); otherwise say what is missing and wait
    for self-healing to make the deployment whole again (it is never shown `ready` with a member that
    does not answer)."""
    _doing(f"asking the engines of deployment {DEMO} whether they still serve")
    runner = getattr(app.state, "job_runner", None)
    liveness = runner.backends["reference"].liveness if runner else None
    found = [a for a in (await liveness.adoption() if liveness else []) if a.deployment == DEMO]
    if liveness and runner and not found:  # a job the crash left ran at start: its end decided; ask now
        found = [a for a in await liveness.adoption(runner.new_fleet) if a.deployment == DEMO]
    ignored = ""
    if engines is not None and engines != deployment["current_dp_size"]:
        ignored = f"; --engines {engines} ignored (to resize: epctl scale {DEMO} {engines})"
    if found and found[0].adopted:
        typer.echo(
            f"epctl up: adopted deployment {DEMO} as it runs: {found[0].summary()}, ready{ignored}", err=True
        )
        return deployment
    what = found[0].summary() if found else "its engines could not be asked"
    typer.echo(f"epctl up: deployment {DEMO} is not whole: {what}; self-healing ...", err=True)
    _doing(f"waiting for self-healing to make deployment {DEMO} whole")
    started = time.monotonic()
    while True:
        await asyncio.sleep(0.5)
        deployment = await _demo_deployment(api)
        if deployment["status"] == "ready" and not deployment["active_job_id"]:
            break
    typer.echo(
        f"epctl up: deployment {DEMO} whole again after {time.monotonic() - started:.1f} s: "
        f"{deployment['current_dp_size']} engines, generation {deployment['generation']}{ignored}",
        err=True,
    )
    return deployment


async def _demo_deployment(api: httpx.AsyncClient) -> dict[str, Any]:
    """The demo deployment, created (size 0, local launcher) when it does not exist."""
    found = await api.get(f"/v1/deployments/{DEMO}")
    if found.status_code == 404:
        created = await api.post(
            "/v1/deployments", json={"name": DEMO, "launcher": "local", "min_dp_size": 1, "max_dp_size": 8}
        )
        created.raise_for_status()
        return dict(created.json())
    found.raise_for_status()
    return dict(found.json())


async def _start_engines(api: httpx.AsyncClient, engines: int) -> None:
    typer.echo(f"epctl up: starting {engines} reference engines for deployment {DEMO} ...", err=True)
    started = time.monotonic()
    requested = await api.post(
        "/v1/reconfigurations",
        json={"deployment": DEMO, "target_dp_size": engines, "source": "cli", "reason": "epctl up"},
    )
    requested.raise_for_status()
    job_id = requested.json()["id"]
    job = await _wait(api, job_id)
    if job["state"] != "succeeded":
        raise RuntimeError(f"starting the engines failed: job {job_id} {job['state']}: {job.get('error')}")
    typer.echo(f"epctl up: {engines} engines serving after {time.monotonic() - started:.1f} s", err=True)


PROGRESS_EVERY_S = 10.0  # a loaded machine takes tens of seconds to start engines: say how it goes


async def _wait(api: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    _doing(None)  # its own lines, with the job's progress
    started = next_line = time.monotonic()
    while True:
        response = await api.get(f"/v1/reconfigurations/{job_id}")
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        if job["terminal"]:
            return job
        if time.monotonic() >= next_line + PROGRESS_EVERY_S:
            next_line = time.monotonic()
            progress = job.get("progress") or {}
            step = f" ({progress['step']})" if progress.get("step") else ""
            typer.echo(
                f"epctl up: job {job_id} {job['state']} {progress.get('percent', 0):.0f}%{step}, "
                f"{next_line - started:.0f} s so far",
                err=True,
            )
        await asyncio.sleep(0.2)


def admin_token_file(settings: Settings) -> Path:
    return Path(settings.data_dir) / ADMIN_TOKEN_FILE


def _session_admin_token(settings: Settings) -> tuple[str, bool]:
    """(an admin token for this session, whether it is new and must be shown). Migrates the database and
    makes its first admin token here, before the coordinator starts, so that exactly one is made and
    printed: EPCTL_ADMIN_TOKEN if set, else the token kept in `<data dir>/admin-token`, else (first start)
    a new one, written there. Never a new token per run."""
    from sqlmodel import Session

    from app.core.ids import new_ulid
    from app.main import start_database
    from app.tokens.models import TokenRole
    from app.tokens.service import authenticate, create_token

    engine, generated = start_database(settings)
    try:
        if settings.admin_token is not None:
            return settings.admin_token.get_secret_value(), False
        path = admin_token_file(settings)
        if generated is not None:
            _write_secret(path, generated)
            return generated, True
        kept = path.read_text().strip() if path.exists() else ""
        with Session(engine) as session:
            if kept and authenticate(session, secret=kept) is not None:
                return kept, False
            # No usable kept token (the database was made by `epctl serve`, or it was revoked): one new
            # admin token, kept for the next runs.
            _, secret = create_token(
                session, name=f"epctl-up-{new_ulid().lower()}", role=TokenRole.admin, created_by="epctl up"
            )
        _write_secret(path, secret)
        return secret, True
    finally:
        engine.dispose()


def _write_secret(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")


def _forget_a_dead_run(settings: Settings) -> None:
    """A previous run whose agents are all gone (killed, or stopped by `epctl down`): record its
    deployments as stopped, so this run starts them again (at the size they had) instead of adopting a
    deployment that no engine serves. Agents still alive are adopted instead (see `_set_up`)."""
    from app.launchers.local import LocalLauncher, is_agent_process

    records = LocalLauncher(state_dir(settings)).records()
    if not records:
        return
    if any(is_agent_process(int(entry.get("pid") or 0), engine_id) for engine_id, entry in records.items()):
        return
    typer.echo("epctl up: the engines of the previous run are gone; starting them again.", err=True)
    _stop_engines(settings, by="their processes were gone when epctl up started")


def _stop_engines(settings: Settings, by: str = "epctl up stopped") -> None:
    """Stop every agent the local launcher started and record the demo deployment as stopped (at the
    size it had: the next `epctl up` brings it back)."""
    stopped = stop_recorded(settings, by=by)
    if stopped.agents:
        typer.echo(f"epctl up: stopped {len(stopped.agents)} agent(s).", err=True)
