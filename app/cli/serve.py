"""`epctl serve`: run the coordinator (migrating its database to head first)."""

from __future__ import annotations

from typing import Annotated

import typer

from app.core.config import ConfigError, load_settings


def serve(
    host: Annotated[str | None, typer.Option(help="bind address (default EPCTL_HOST or 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default EPCTL_PORT or 8000)")] = None,
) -> None:
    """Run the coordinator: migrate the database to head, then serve the REST API."""
    import uvicorn
    from sqlalchemy.exc import SQLAlchemyError

    from app.main import announce_admin_token, create_app, start_database

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
    try:
        engine, generated = start_database(settings)
    except SQLAlchemyError as exc:
        typer.echo(f"epctl serve: cannot use database {settings.database_url!r}: {exc}", err=True)
        raise typer.Exit(1) from None
    engine.dispose()
    if generated is not None:
        announce_admin_token(generated)
    typer.echo(
        f"epctl: coordinator on http://{settings.host}:{settings.port} (database {settings.database_url})",
        err=True,
    )
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")
