"""`epctl serve`: run the coordinator (migrating its database to head first)."""

from __future__ import annotations

import contextlib
import errno
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from app.core.config import Settings


def claim_data_dir(settings: Settings, *, holder: str = "epctl serve") -> Path | None:
    """Lock the local launcher's data directory before touching anything, when this coordinator runs
    jobs (and so may start and stop local agents there); `DataDirInUseError` when another holds it."""
    from app.core.runner_settings import load_runner_settings
    from app.launchers.state_lock import hold_state_dir

    runner = load_runner_settings()
    if not runner.enabled:
        return None
    return hold_state_dir(Path(runner.state_dir or settings.data_dir), holder=holder)


def claim_or_close(settings: Settings, sock: socket.socket, *, holder: str = "epctl serve") -> None:
    """`claim_data_dir`, closing the socket already bound when the directory is another's."""
    try:
        claim_data_dir(settings, holder=holder)
    except BaseException:
        sock.close()
        raise


class PortUnavailableError(Exception):
    """The coordinator's address cannot be listened on (in use, not ours, not an address here)."""


def server_config(app: FastAPI, settings: Settings, *, log_level: str) -> uvicorn.Config:
    """The coordinator's uvicorn config, on its address and with its certificate (HTTPS when one is
    set); log_config=None: uvicorn's loggers go through the handler configure_logging set up."""
    import uvicorn  # here, not at the top: the CLI's other commands start without it

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        log_config=None,
        ssl_certfile=settings.tls_cert_file,
        ssl_keyfile=settings.tls_key_file,
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """The coordinator's socket, bound before anything else starts (uvicorn is handed it), so that a
    busy port is one line and a non-zero exit, not a traceback after the database was touched."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortUnavailableError(
                f"cannot listen on {host}:{port}: address already in use (another coordinator? "
                "stop it, or choose another port with --port)"
            ) from None
        raise PortUnavailableError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(
    host: Annotated[str | None, typer.Option(help="bind address (default EPCTL_HOST or 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default EPCTL_PORT or 8000)")] = None,
) -> None:
    """Run the coordinator: migrate the database to head, then serve the REST API."""
    import uvicorn
    from sqlalchemy.exc import SQLAlchemyError

    from app.core.config import ConfigError, load_settings
    from app.core.private_files import keep_new_files_private
    from app.launchers.state_lock import DataDirInUseError
    from app.main import announce_admin_token, create_app, start_database
    from engine_agent.logs import configure_logging

    keep_new_files_private()  # the database, token files, pid records and logs it writes: 0600
    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    try:
        settings = load_settings(**overrides)
    except ConfigError as exc:
        typer.echo(f"epctl serve: {exc}", err=True)
        raise typer.Exit(2) from None
    configure_logging(settings.log_format)
    try:
        # The port first: a busy one refuses before the data directory or its lock is made.
        sock = listening_socket(settings.host, settings.port)
        claim_or_close(settings, sock)
    except (ConfigError, DataDirInUseError, PortUnavailableError) as exc:
        typer.echo(f"epctl serve: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        engine, generated = start_database(settings)
    except SQLAlchemyError as exc:
        sock.close()
        typer.echo(f"epctl serve: cannot use database {settings.database_url!r}: {exc}", err=True)
        raise typer.Exit(1) from None
    engine.dispose()
    if generated is not None:
        announce_admin_token(generated)
    config = server_config(create_app(settings, freeze_heap=True), settings, log_level="info")
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled
        server.run(sockets=[sock])
    if not server.started:
        raise typer.Exit(1)
