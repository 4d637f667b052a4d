"""The CLI's fast path around typer's coercion (`app/cli/coercion.py`) changes no value and no error:
every command line below parses to the same values, or fails with the same message, with and
without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer import core
from typer.testing import CliRunner

import app.cli.main  # noqa: F401  (installs the fast path)

probe_app = typer.Typer()


@probe_app.command()
def values(
    name: Annotated[str, typer.Argument()],
    text: Annotated[str | None, typer.Option("--text")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=500)] = 20,
    count: Annotated[int | None, typer.Option("--count")] = None,
    ratio: Annotated[float, typer.Option("--ratio")] = 0.5,
    tags: Annotated[list[str] | None, typer.Option("--tag")] = None,
    where: Annotated[Path | None, typer.Option("--where")] = None,
    flag: Annotated[bool, typer.Option("--flag/--no-flag")] = False,
) -> None:
    parsed = [name, text, limit, count, ratio, tags, str(where) if where else None, flag]
    print(json.dumps([[type(v).__name__, v] for v in parsed]))


COMMAND_LINES = [
    ["x"],
    ["x", "--text", "hello", "--flag"],
    ["x", "-n", "5", "--count", "7", "--ratio", "2"],
    ["x", "--tag", "a", "--tag", "b", "--where", "/tmp/w", "--no-flag"],
    ["x", "-n", "0"],
    ["x", "-n", "501"],
    ["x", "--count", "seven"],
    ["x", "--ratio", "fast"],
    ["x", "--text", ""],
]


def run(argv: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(probe_app, argv)
    return result.exit_code, result.output


def test_the_fast_path_is_installed() -> None:
    assert getattr(core.build_runtime_param, "epctl_fast_path", False)


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=" ".join)
def test_every_command_line_parses_as_typer_alone_parses_it(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with_fast_path = run(argv)
    typers_own = core.build_runtime_param.typers_own  # type: ignore[attr-defined]
    monkeypatch.setattr(core, "build_runtime_param", typers_own)
    assert run(argv) == with_fast_path
