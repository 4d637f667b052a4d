"""`epctl`: the command line. Each command group lives in its own module under app/cli/ and is named
in `COMMANDS` (a typer app for a group, a function for a single command).

Start-up is kept under ~0.3 s of CPU: typer builds (and type-checks) every command it knows before it
runs one, so the root group loads only the command asked for (`LazyRoot`); `epctl --help` loads them
all to list them. Help is plain text (rich's help renderer alone costs more CPU to import than that),
and values that need no conversion skip typer's pydantic-based coercion (`app.cli.coercion`).

The global options (`--url`, `--token`, `--json`) are each command's own options, so they may come
after the command as always; the root group also accepts them before it (and lists them in `epctl
--help`) by moving them behind the command path before it parses (`route_global_options`).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from app.cli import coercion
from app.cli.client import DEFAULT_URL, JsonOption, TokenOption, UrlOption

coercion.install()  # values that need no conversion skip typer's pydantic (see app/cli/coercion.py)

# name -> (module, attribute): a typer app (a command group) or a function (one command), in the
# order `epctl --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("app.cli.serve", "serve"),
    "up": ("app.cli.up", "up"),
    "down": ("app.cli.down", "down"),
    "scale": ("app.cli.scale", "scale"),
    "deployments": ("app.cli.deployments", "app"),
    "engines": ("app.cli.engines", "app"),
    "incidents": ("app.cli.incidents", "app"),
    "jobs": ("app.cli.jobs", "app"),
    "cleanup": ("app.cli.jobs", "cleanup_app"),
    "webhooks": ("app.cli.webhooks", "app"),
    "tokens": ("app.cli.tokens", "app"),
}

VALUE_OPTIONS = ("--url", "--token")
FLAG_OPTIONS = ("--json",)


def load_command(name: str) -> Any:
    """The click command (or group) of `name`, built from its module."""
    module, attribute = COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        command: Any = typer.main.get_group(target)
    else:
        single = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


def _global_tokens(args: list[str]) -> tuple[list[list[str]], list[str]]:
    """The global options in `args` (each as its tokens: `--url U`, `--url=U`, `--json`) and the
    rest; nothing after `--` is looked at."""
    end = args.index("--") if "--" in args else len(args)
    found: list[list[str]] = []
    rest: list[str] = []
    i = 0
    while i < end:
        arg = args[i]
        name = arg.split("=", 1)[0]
        if name in VALUE_OPTIONS and "=" not in arg and i + 1 < end:
            found.append(args[i : i + 2])
            i += 2
        elif name in VALUE_OPTIONS or arg in FLAG_OPTIONS:
            found.append([arg])
            i += 1
        else:
            rest.append(arg)
            i += 1
    return found, rest + args[end:]


def route_global_options(root: Any, ctx: Any, args: list[str]) -> list[str]:
    """`epctl --token T jobs list` means `epctl jobs list --token T`: each global option goes right
    behind the command path when that command takes it (a later one on the command itself still
    wins), else stays with the root group, which accepts and ignores it (`epctl --json serve`)."""
    found, rest = _global_tokens(args)
    if not found:
        return args
    command, depth = root, 0
    while depth < len(rest) and hasattr(command, "get_command"):
        child = command.get_command(ctx, rest[depth])
        if child is None:
            break
        command, depth = child, depth + 1
    accepted: set[str] = set()
    if not hasattr(command, "get_command"):  # a command, not a group
        accepted = {opt for param in command.params for opt in getattr(param, "opts", [])}
    to_command = [token for tokens in found if tokens[0].split("=", 1)[0] in accepted for token in tokens]
    to_root = [token for tokens in found if tokens[0].split("=", 1)[0] not in accepted for token in tokens]
    return to_root + rest[:depth] + to_command + rest[depth:]


class LazyRoot(TyperGroup):
    """The root group: its commands come from `COMMANDS`, loaded when asked for; the global options
    are routed (see `route_global_options`) before parsing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loaded: dict[str, Any] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if cmd_name not in self._loaded:
            self._loaded[cmd_name] = load_command(cmd_name)
        return self._loaded[cmd_name]

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, route_global_options(self, ctx, list(args)))


app = typer.Typer(
    name="epctl",
    cls=LazyRoot,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Elastic expert-parallel reconfiguration control plane.

    --url, --token and --json go before or after the command (epctl --json jobs list, epctl jobs list
    --json); EPCTL_URL and EPCTL_TOKEN set the first two for every command.
    """


def main() -> None:
    app(args=sys.argv[1:], prog_name="epctl")


if __name__ == "__main__":
    main()
