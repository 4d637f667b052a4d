"""One coordinator per data directory (`app.launchers.state_lock`), and the stable lease owner it allows."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sqlmodel import SQLModel, create_engine

from app.core.config import load_settings
from app.core.runner_settings import RunnerSettings
from app.launchers.local import LocalLauncher
from app.launchers.state_lock import LOCK_FILE, DataDirInUseError, hold_state_dir, holds_state_dir
from app.runner.lifespan import build_runner
from tests.support.processes import clean_environment, epctl_command, free_port

HOLD = """
import sys, time
from pathlib import Path
from app.launchers.state_lock import hold_state_dir
hold_state_dir(Path(sys.argv[1]), holder="the first")
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.processes
def test_a_second_process_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(state)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        before = {p.name: p.read_bytes() for p in state.iterdir()}
        with pytest.raises(DataDirInUseError, match="in use by another coordinator") as refused:
            hold_state_dir(state, holder="the second")
        assert "the first" in refused.value.holder and str(holder.pid) in refused.value.holder
        assert {p.name: p.read_bytes() for p in state.iterdir()} == before
        assert not holds_state_dir(state)
    finally:
        holder.kill()
        holder.wait()
    # The kernel let the lock go with the process: the directory is free again.
    assert hold_state_dir(state, holder="the second") == state.resolve()
    assert hold_state_dir(state, holder="again") == state.resolve()  # the holder takes it again freely
    assert "the second" in (state / LOCK_FILE).read_text()


def test_the_holder_of_a_data_dir_keeps_its_lease_owner_name_across_restarts(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path)
    db = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    SQLModel.metadata.create_all(db)
    unlocked = build_runner(settings, db, RunnerSettings(state_dir=tmp_path / "elsewhere"))
    assert unlocked.leases.owner != f"{socket.gethostname()}:{(tmp_path / 'elsewhere').resolve()}"
    hold_state_dir(tmp_path, holder="test")
    runner = build_runner(settings, db, RunnerSettings())
    # A restarted coordinator on this directory claims the jobs this name holds at once (leases.py).
    assert runner.leases.owner == f"{socket.gethostname()}:{tmp_path.resolve()}"


@pytest.mark.processes
def test_epctl_serve_on_a_data_dir_in_use_refuses_with_one_line_before_touching_it(tmp_path: Path) -> None:
    state = tmp_path / "data"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(state)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        env = clean_environment({"EPCTL_DATA_DIR": str(state), "EPCTL_PORT": str(free_port())})
        served = subprocess.run(
            [*epctl_command(), "serve"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert served.returncode == 1
        lines = (served.stdout + served.stderr).strip().splitlines()
        assert len(lines) == 1 and "is in use by another coordinator (the first" in lines[0], lines
        assert sorted(p.name for p in state.iterdir()) == [LOCK_FILE]  # no database made
    finally:
        holder.kill()
        holder.wait()


def test_the_local_launcher_waits_for_an_agent_as_long_as_the_launch_deadline(tmp_path: Path) -> None:
    """EPCTL_RUNNER_LAUNCH_DEADLINE_S is what the local launcher waits for an agent to be ready (it was
    capped at the launcher's own 30 s default, whatever the operator set)."""
    settings = load_settings(data_dir=tmp_path)
    db = create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    SQLModel.metadata.create_all(db)
    runner = build_runner(settings, db, RunnerSettings(state_dir=tmp_path, launch_deadline_s=90.0))
    local = runner.launchers["local"]
    assert isinstance(local, LocalLauncher) and local.ready_timeout_s == 90.0
