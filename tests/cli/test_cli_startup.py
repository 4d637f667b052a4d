"""`epctl` starts light (benchmarks/cli.py measures the CPU; here, what it imports, which is what
makes it cost): `--help` and a simple read load neither httpx, rich's help renderer, pydantic, nor
the coordinator's own stack (settings, SQLAlchemy, FastAPI); a read does not even load asyncio (only
`epctl up` needs it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.processes import ROOT, clean_environment

HEAVY = (
    "httpx",
    "typer.rich_utils",
    "pydantic",  # typer's own coercion would import it (app/cli/coercion.py passes plain values through)
    "sqlalchemy",
    "fastapi",
    "app.core.config",
    "app.main",
    "asyncio",
)
HELP_MAY_LOAD = {"asyncio"}  # `--help` loads every command to list it, `epctl up` with them


def imported_heavy(*argv: str) -> list[str]:
    """The heavy modules `epctl ARGV` imported by the time it exited (against a closed port)."""
    code = (
        "import sys, json\n"
        "from app.cli.main import app\n"
        "try:\n"
        f"    app(args={list(argv)!r}, prog_name='epctl')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    env = clean_environment({"EPCTL_URL": "http://127.0.0.1:9", "EPCTL_TOKEN": "t", "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.processes
def test_the_top_level_help_imports_nothing_heavy() -> None:
    assert set(imported_heavy("--help")) <= HELP_MAY_LOAD


@pytest.mark.processes
def test_a_simple_read_imports_nothing_heavy() -> None:
    assert imported_heavy("--json", "jobs", "list") == []
    assert imported_heavy("jobs", "show", "rcfg_x") == []
