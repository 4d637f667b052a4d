"""`epctl up`'s front door: a local HAProxy for the demo deployment, kept in step by the coordinator's
keeper (`app.frontdoor.keeper`). No HAProxy installed: `epctl up` says so and runs without one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from app.frontdoor.launch import RunningDoor
    from app.frontdoor.settings import FrontDoorSpec


def open_front_door(
    state_dir: Path, deployment: str, port: int, tls_ca_file: str | None = None
) -> tuple[RunningDoor | None, list[FrontDoorSpec]]:
    """(the HAProxy started or adopted, the specs to keep) or (None, []) with a line saying why.
    `tls_ca_file`: the engines serve HTTPS with certificates this bundle signed (`agent_tls_ca`)."""
    from app.frontdoor.haproxy import DoorConfig
    from app.frontdoor.launch import FrontDoorUnavailable, start_front_door
    from app.frontdoor.settings import FrontDoorSpec

    try:
        config = DoorConfig(deployment, "127.0.0.1", port, tls_ca_file=tls_ca_file)
        door = start_front_door(state_dir / "front-door", config)
    except FrontDoorUnavailable as exc:
        typer.echo(f"epctl up: no front door: {exc}; clients must call the engines", err=True)
        return None, []
    if door.adopted:
        typer.echo(f"epctl up: front door at {door.url} kept from the previous run (HAProxy)", err=True)
    return door, [
        FrontDoorSpec(
            deployment=deployment,
            url=door.url,
            socket=door.socket_path,
            request_log=door.request_log,
            tls_ca_file=tls_ca_file,
        )
    ]


def agent_tls_ca(agent_ca_file: Path | None, environ: Mapping[str, str]) -> str | None:
    """The CA bundle the front door verifies engines with, where the agents `epctl up` starts serve
    HTTPS (`EPCTL_AGENT_TLS_CERT_FILE`, passed on to them): the coordinator's `agent_ca_file`, else the
    system's trust store (HAProxy's `@system-ca`); None where they serve plain HTTP."""
    if not environ.get("EPCTL_AGENT_TLS_CERT_FILE"):
        return None
    return str(agent_ca_file) if agent_ca_file else "@system-ca"
