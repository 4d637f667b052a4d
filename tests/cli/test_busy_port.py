"""`epctl up` and `epctl serve` on a port another process holds: one line that says so, a non-zero
exit, and nothing touched (no data directory, lock or database made), in a real process."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import clean_environment, epctl_command


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize("command", ["up", "serve"])
@pytest.mark.processes
def test_a_busy_port_is_one_line_and_a_non_zero_exit(command: str, busy_port: int, tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [*epctl_command(), command, "--port", str(busy_port)],
        env=clean_environment({"EPCTL_DATA_DIR": str(data), "EPCTL_HOST": "127.0.0.1"}),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"epctl {command}: cannot listen on 127.0.0.1:{busy_port}: address already in use"
    )
    assert not data.exists()  # no database, and neither the data directory nor its lock
