"""A start is never silent: `epctl up` says what it is still doing at least every 10 s
(`app.cli.heartbeat`), the set-up scripts tick every 10 s, and `scripts/run --help` answers before
anything is built."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from app.cli.heartbeat import EVERY_S, Heartbeat

ROOT = Path(__file__).resolve().parents[2]


def test_the_heartbeat_names_the_step_still_going_and_is_quiet_while_paused() -> None:
    lines: list[str] = []
    told = threading.Event()

    def echo(line: str) -> None:
        lines.append(line)
        told.set()

    beat = Heartbeat("epctl up", echo, every_s=0.02)
    beat.start("migrating the database")
    try:
        assert told.wait(10.0)
    finally:
        beat.stop()
    assert lines[0].startswith("epctl up: still migrating the database ("), lines
    paused = Heartbeat("epctl up", echo, every_s=0.02)
    paused.start("x")
    paused.doing(None)
    lines.clear()
    paused.stop()
    assert all("still x" not in line for line in lines)
    assert EVERY_S <= 10.0


def test_the_set_up_steps_tick_every_10_s() -> None:
    steps = (ROOT / "scripts" / "steps.sh").read_text()
    assert "sleep 10 & nap=$!" in steps


@pytest.mark.processes
def test_scripts_run_help_answers_before_building_anything(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    for name in ("run", "steps.sh"):
        shutil.copy(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    built = tmp_path / "built"
    bootstrap = tmp_path / "scripts" / "bootstrap"
    bootstrap.write_text(f"#!/bin/sh\ntouch {built}\n")
    bootstrap.chmod(0o755)
    done = subprocess.run(
        [str(tmp_path / "scripts" / "run"), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert not built.exists()  # no environment set up for a --help
    from app.cli.up import up

    options = [f"--{name.replace('_', '-')}" for name in inspect.signature(up).parameters]
    assert options and all(option in done.stdout for option in options), (options, done.stdout)
