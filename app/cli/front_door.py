"""`epctl up`'s front door: a local HAProxy for the demo deployment, kept in step by the coordinator's
keeper (`app.frontdoor.keeper`). No HAProxy installed: `epctl up` says so and runs without one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from app.frontdoor.launch import RunningDoor
    from app.frontdoor.settings import FrontDoorSpec


def open_front_door(
    state_dir: Path, deployment: str, port: int
) -> tuple[RunningDoor | None, list[FrontDoorSpec]]:
    """(the HAProxy started or adopted, the specs to keep) or (None, []) with a line saying why."""
    from app.frontdoor.haproxy import DoorConfig
    from app.frontdoor.launch import FrontDoorUnavailable, start_front_door
    from app.frontdoor.settings import FrontDoorSpec

    try:
        door = start_front_door(state_dir / "front-door", DoorConfig(deployment, "127.0.0.1", port))
    except FrontDoorUnavailable as exc:
        typer.echo(f"epctl up: no front door: {exc}; clients must call the engines", err=True)
        return None, []
    if door.adopted:
        typer.echo(f"epctl up: front door at {door.url} kept from the previous run (HAProxy)", err=True)
    return door, [
        FrontDoorSpec(
            deployment=deployment, url=door.url, socket=door.socket_path, request_log=door.request_log
        )
    ]
