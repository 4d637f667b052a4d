"""The local launcher starts agent processes, records their pids, and stops them again."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from app.launchers.base import LaunchError, LaunchSpec
from app.launchers.local import LocalLauncher
from engine_agent.protocol import EngineConfig
from tests.support.agent_zygote import Zygote

SPEC = LaunchSpec(deployment="demo", engine=EngineConfig(num_logical_experts=8, hidden_size=32))

# A stand-in agent: writes its URL to --ready-file like epctl-agent does, then waits to be stopped.
FAKE_AGENT = textwrap.dedent(
    """
    import sys, time
    ready = sys.argv[sys.argv.index("--ready-file") + 1]
    with open(ready, "w") as f:
        f.write("http://127.0.0.1:1\\n")
    time.sleep(60)
    """
)


@pytest.mark.processes
def test_started_agents_are_recorded_and_released_agents_stopped(tmp_path: Path) -> None:
    script = tmp_path / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    launcher = LocalLauncher(tmp_path, executable=[sys.executable, str(script)])

    async def go() -> None:
        engines = await launcher.ensure_engines(SPEC, 2, [], deadline_s=20)
        assert len(engines) == 2 and all(e.url == "http://127.0.0.1:1" for e in engines)
        assert launcher.launch_budget(SPEC, 60.0).source == "observed"  # their start-to-ready times
        assert set(launcher.records()) == {e.engine_id for e in engines}
        processes = [launcher._processes[e.engine_id] for e in engines]
        gone = await launcher.release(SPEC, engines)
        assert sorted(gone) == sorted(e.engine_id for e in engines)
        assert all(p.poll() is not None for p in processes)
        assert launcher.records() == {}

    asyncio.run(go())


def test_idle_engines_are_used_before_starting_new_ones(tmp_path: Path) -> None:
    from app.launchers.base import EngineHandle

    launcher = LocalLauncher(tmp_path, executable=[sys.executable, "-c", "raise SystemExit(1)"])
    idle = [EngineHandle(engine_id="demo-idle", url="http://127.0.0.1:2")]
    assert asyncio.run(launcher.ensure_engines(SPEC, 1, idle, deadline_s=5)) == idle


@pytest.mark.processes
def test_an_agent_that_exits_before_it_is_ready_fails_its_launch_at_once_with_its_reason(
    tmp_path: Path,
) -> None:
    """Not at the timeout (an hour here: the test would hang), and with what the agent said last."""
    fatal = "import sys; print('RuntimeError: no device for rank 3', file=sys.stderr); sys.exit(3)"
    launcher = LocalLauncher(tmp_path, executable=[sys.executable, "-c", fatal])
    spec = dataclasses.replace(SPEC, launch_timeout_s=3600.0)
    with pytest.raises(LaunchError) as caught:
        asyncio.run(launcher.ensure_engines(spec, 1, [], deadline_s=3600.0))
    assert caught.value.engine_id is not None and "exited with code 3" in caught.value.message
    assert caught.value.type == "launch-failed"
    assert "RuntimeError: no device for rank 3" in caught.value.message
    assert launcher.records() == {}
    assert launcher.launch_budget(SPEC, 60.0).source == "default"  # a failed launch is no observation


@pytest.mark.processes
def test_stop_all_names_only_the_agents_it_stopped(tmp_path: Path) -> None:
    """`epctl down` reports what it stopped: an agent whose process had exited long before is not named
    (its record is dropped all the same)."""
    script = tmp_path / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    launcher = LocalLauncher(tmp_path, executable=[sys.executable, str(script)])
    running, exited = asyncio.run(launcher.ensure_engines(SPEC, 2, [], deadline_s=20))
    launcher._processes[exited.engine_id].kill()
    launcher._processes[exited.engine_id].wait()
    after_restart = LocalLauncher(tmp_path)  # a later `epctl down`: only the records to go by
    assert after_restart.stop_all() == [running.engine_id]
    assert after_restart.records() == {}
    launcher._processes[running.engine_id].wait(timeout=10)


@pytest.mark.processes
def test_agents_forked_from_a_zygote_are_recorded_named_stopped_and_a_gone_zygote_costs_no_launch(
    tmp_path: Path, agent_zygote: Zygote
) -> None:
    """With a zygote (`engine_agent/zygote.py`), the launcher's agents are forked from it, not fresh
    interpreters: the zygote is their parent, their command line names the engine (so a later `epctl
    down`, with only the records to go by, stops them), their log is theirs; with no zygote answering
    the launcher starts a fresh interpreter instead."""
    launcher = LocalLauncher(tmp_path / "state", zygote=agent_zygote.socket_path)
    gone = LocalLauncher(tmp_path / "state", zygote=str(tmp_path / "no-zygote.sock"))
    spec = dataclasses.replace(SPEC, agent_key="k" * 32)

    async def go() -> None:
        [forked] = await launcher.ensure_engines(spec, 1, [], deadline_s=60)
        [fresh] = await gone.ensure_engines(spec, 1, [], deadline_s=120)
        assert forked.pid is not None and fresh.pid is not None
        assert _parent(forked.pid) == agent_zygote.process.pid and _parent(fresh.pid) == os.getpid()
        assert forked.engine_id.encode() in Path(f"/proc/{forked.pid}/cmdline").read_bytes()
        assert httpx.get(f"{forked.url}/healthz", timeout=10).status_code == 200
        log = Path(launcher.records()[forked.engine_id]["log"])
        after_restart = LocalLauncher(tmp_path / "state")  # `epctl down`: only the records to go by
        assert sorted(after_restart.stop_all()) == sorted([forked.engine_id, fresh.engine_id])
        assert launcher._processes[forked.engine_id].wait(timeout=10) is not None
        assert after_restart.records() == {} and forked.url in log.read_text()  # its output, its log

    asyncio.run(go())


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
