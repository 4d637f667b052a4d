"""`epctl`: the command line. Each command group lives in its own module under app/cli/ and is
registered here (`app.command(...)` for a top-level command, `app.add_typer(...)` for a group)."""

from __future__ import annotations

import sys

import typer

from app.cli import deployments, engines, jobs, tokens, webhooks
from app.cli.down import down
from app.cli.scale import scale
from app.cli.serve import serve
from app.cli.up import up

app = typer.Typer(
    name="epctl",
    help="Elastic expert-parallel reconfiguration control plane.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Elastic expert-parallel reconfiguration control plane."""


app.command("serve")(serve)
app.command("up")(up)
app.command("down")(down)
app.add_typer(deployments.app, name="deployments")
app.add_typer(engines.app, name="engines")
app.command("scale")(scale)
app.add_typer(jobs.app, name="jobs")
app.add_typer(jobs.cleanup_app, name="cleanup")
app.add_typer(webhooks.app, name="webhooks")
app.add_typer(tokens.app, name="tokens")

GLOBAL_FLAGS = ("--json",)


def hoist_flags(argv: list[str]) -> list[str]:
    """`epctl --json jobs list` and `epctl jobs --json list` mean `epctl jobs list --json`: the flag is
    an option of each command, so move it behind the command path (nothing after `--` moves)."""
    end = argv.index("--") if "--" in argv else len(argv)
    flags = [arg for arg in argv[:end] if arg in GLOBAL_FLAGS]
    if not flags:
        return argv
    rest = [arg for arg in argv[:end] if arg not in GLOBAL_FLAGS]
    return rest + flags + argv[end:]


def main() -> None:
    app(args=hoist_flags(sys.argv[1:]), prog_name="epctl")


if __name__ == "__main__":
    main()
