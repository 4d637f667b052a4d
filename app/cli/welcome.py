"""What `epctl up` prints once its deployment serves: where the coordinator, the dashboard and the front
door are, how to use the admin token, and commands that paste as they are (`epctl` named as this shell
can run it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.core.config import Settings
    from app.frontdoor.settings import FrontDoorSpec


def runnable_epctl(argv0: str | None = None, cwd: Path | None = None) -> str:
    """`epctl` as this shell can run it, for commands that must paste: `epctl` when that name on PATH is
    this program, else the path it was started by (`.venv/bin/epctl` from a checkout's `scripts/run`),
    else `python -m app.cli.main`."""
    import shutil

    started = Path(argv0 if argv0 is not None else sys.argv[0])
    on_path = shutil.which("epctl")
    if on_path and started.name == "epctl" and Path(on_path).resolve() == started.resolve():
        return "epctl"
    if started.name == "epctl" and started.is_file():
        absolute = Path(os.path.abspath(started))
        try:
            relative = str(absolute.relative_to(cwd or Path.cwd()))
        except ValueError:
            return str(absolute)
        return relative if "/" in relative else f"./{relative}"
    return "epctl" if on_path else f"{sys.executable} -m app.cli.main"


def print_welcome(
    url: str,
    new_token: str | None,
    settings: Settings,
    engines: int,
    doors: list[FrontDoorSpec],
    *,
    deployment: str,
    token_file: Path,
) -> None:
    """`new_token` is printed (once: it was just made); otherwise the welcome says where the token is.
    Every command in it pastes as it is (`epctl` named as this shell can run it)."""
    bigger = min(engines * 2, 8)
    epctl = runnable_epctl()
    curl = 'curl -s -H "Authorization: Bearer $EPCTL_TOKEN"'
    if settings.admin_token is not None:
        token_lines = ["  export EPCTL_TOKEN=$EPCTL_ADMIN_TOKEN"]
    elif new_token is not None:
        token_lines = [
            f"  export EPCTL_TOKEN={new_token}",
            f"  # admin token, shown once; kept for later `epctl up` runs in {token_file}",
        ]
    else:
        token_lines = [f"  export EPCTL_TOKEN=$(cat {token_file})"]
    lines = [
        "",
        f"  epctl up: coordinator at {url} (database {settings.database_url})",
        f"  deployment {deployment}: {engines} reference engines serving; dashboard {url}/ui/",
        *(
            [
                f"  front door (HAProxy): {doors[0].url}/v1/infer"
                f" (rank set: $EPCTL_URL/v1/deployments/{deployment}/endpoints)"
            ]
            if doors
            else [
                "  no front door: clients call the engines"
                f" ($EPCTL_URL/v1/deployments/{deployment}/endpoints)"
            ]
        ),
        "",
        f"  export EPCTL_URL={url}",
        *token_lines,
        "",
        f"  # scale {deployment} to {bigger} engines (202 + Location of the job):",
        f"  {curl} -X POST $EPCTL_URL/v1/reconfigurations -H 'Content-Type: application/json' \\",
        f'       -d \'{{"deployment": "{deployment}", "target_dp_size": {bigger}}}\'',
        "  # the job: state, progress, phases with start/end, per-engine results, downtime_ms:",
        f"  {curl} $EPCTL_URL/v1/reconfigurations/<job id>",
        f"  # back to {engines}:",
        f"  {curl} -X POST $EPCTL_URL/v1/reconfigurations -H 'Content-Type: application/json' \\",
        f'       -d \'{{"deployment": "{deployment}", "target_dp_size": {engines}}}\'',
        f"  # or, with the CLI:  {epctl} scale {deployment} {bigger} --wait",
        "",
        "  Ctrl-C stops the coordinator and its engines.",
        "",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)
