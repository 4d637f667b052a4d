"""`epctl down --data-dir D`: stop what a data directory's records name, by pid, and say what it stopped.

Engines outlive their coordinator (serving never depends on it), so an `epctl up` that crashed, or a
coordinator that is gone for good, leaves its engines serving until a later `epctl up` adopts them or
the operator stops them here: every agent the local launcher recorded in `local-agents.json` and every
vLLM server in `vllm-servers.json` (each checked to still be that process: pids are reused; only the
processes it stopped are named), and the record of the local deployments set to `stopped` (size 0 with
the size they had kept, engines `left`, open jobs ended: `app.jobs.stop`), so the next `epctl up`
brings them back at that size. A directory a live coordinator holds is left alone: stop that
coordinator instead (an `epctl up` stops its engines on Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # the CLI imports only what the command it runs needs (`epctl --help` loads all)
    from app.core.config import Settings


@dataclass
class Stopped:
    agents: list[str] = field(default_factory=list)  # "engine-id (pid N)"
    vllm_servers: list[str] = field(default_factory=list)  # deployment names
    recorded: bool = True  # the database says so too


def state_dir(settings: Settings) -> Path:
    from app.core.runner_settings import load_runner_settings

    with contextlib.suppress(Exception):  # bad runner settings: the default directory
        return Path(load_runner_settings().state_dir or settings.data_dir)
    return Path(settings.data_dir)


def stop_recorded(settings: Settings, *, by: str = "epctl down") -> Stopped:
    """Stop every engine the data directory's records name and record the local deployments stopped;
    what was running and stopped (a recorded agent that had exited already is not named)."""
    from app.backends.vllm.launcher import VllmLauncher
    from app.launchers.local import LocalLauncher

    directory = state_dir(settings)
    local = LocalLauncher(directory)
    pids = {engine_id: entry.get("pid") for engine_id, entry in local.records().items()}
    stopped = Stopped(agents=[f"{engine_id} (pid {pids.get(engine_id)})" for engine_id in local.stop_all()])
    stopped.vllm_servers = VllmLauncher(Path(settings.data_dir), python="python").stop_all()
    stopped.recorded = _record_stopped(settings, by)
    return stopped


def _record_stopped(settings: Settings, by: str) -> bool:
    from sqlmodel import Session, select

    from app.core.db import make_engine
    from app.deployments.models import Deployment
    from app.jobs.stop import record_stopped

    engine = make_engine(settings.database_url)
    try:
        with Session(engine) as session:
            for deployment in session.exec(select(Deployment).where(Deployment.launcher == "local")).all():
                record_stopped(session, deployment, by=by)
    except Exception as exc:  # the database may be gone; the processes are what matters
        typer.echo(f"epctl: could not record the stop in the database: {exc}", err=True)
        return False
    finally:
        engine.dispose()
    return True


def down(
    data_dir: Annotated[
        Path | None,
        typer.Option(help="the data directory whose engines to stop (default EPCTL_DATA_DIR or .data)"),
    ] = None,
) -> None:
    """Stop the engines a data directory's records name (after a crashed `epctl up`), by pid."""
    from app.core.config import ConfigError, load_settings
    from app.launchers.state_lock import DataDirInUseError, hold_state_dir

    overrides: dict[str, object] = {} if data_dir is None else {"data_dir": data_dir}
    try:
        settings = load_settings(**overrides)
        hold_state_dir(state_dir(settings), holder="epctl down")
    except ConfigError as exc:
        typer.echo(f"epctl down: {exc}", err=True)
        raise typer.Exit(2) from None
    except DataDirInUseError as exc:
        typer.echo(
            f"epctl down: a coordinator holds {exc.state_dir} ({exc.holder}): stop it instead "
            "(`epctl up` stops its engines on Ctrl-C or SIGTERM)",
            err=True,
        )
        raise typer.Exit(1) from None
    from app.frontdoor.launch import stop_recorded_front_door

    stopped = stop_recorded(settings)
    for line in stopped.agents:
        typer.echo(f"stopped agent {line}")
    for name in stopped.vllm_servers:
        typer.echo(f"stopped the vLLM server of deployment {name}")
    door = stop_recorded_front_door(state_dir(settings) / "front-door")
    if door is not None:
        typer.echo(f"stopped the front door (HAProxy, pid {door})")
    if not (stopped.agents or stopped.vllm_servers or door):
        typer.echo(f"nothing recorded in {state_dir(settings)} was running")
