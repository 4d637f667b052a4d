"""Issue 17, finding 10 (and issue 25, the agent keys): a locally launched agent gets its bearer token
and its deployment's agent keys through its environment, never on its command line (which any local
user reads in /proc/<pid>/cmdline or `ps`)."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from app.launchers.base import LaunchSpec
from app.launchers.local import LocalLauncher
from engine_agent.protocol import EngineConfig

TOKEN = "epctl_agent-secret-for-this-test"
SPEC = LaunchSpec(
    deployment="demo",
    engine=EngineConfig(num_logical_experts=8, hidden_size=32),
    coordinator_url="http://127.0.0.1:1",
    token=TOKEN,
    agent_key="epak_current-key-for-this-test",
    agent_key_previous="epak_previous-key-for-this-test",
)
SECRETS = (TOKEN, "epak_current-key-for-this-test", "epak_previous-key-for-this-test")

# A stand-in agent (the real one needs torch and a coordinator): reports what it was given, as
# `engine_agent.main` would read it, then waits to be stopped.
REPORTING_AGENT = textwrap.dedent(
    """
    import json, os, sys, time
    ready = sys.argv[sys.argv.index("--ready-file") + 1]
    with open(ready + ".given", "w") as f:
        given = {"argv": sys.argv, "token": os.environ.get("EPCTL_TOKEN")}
        given["key"] = os.environ.get("EPCTL_AGENT_KEY")
        given["previous"] = os.environ.get("EPCTL_AGENT_KEY_PREVIOUS")
        json.dump(given, f)
    with open(ready, "w") as f:
        f.write("http://127.0.0.1:1\\n")
    time.sleep(60)
    """
)


@pytest.mark.processes
def test_the_agent_token_travels_in_the_environment_not_argv(tmp_path: Path) -> None:
    script = tmp_path / "reporting_agent.py"
    script.write_text(REPORTING_AGENT)
    launcher = LocalLauncher(tmp_path / "state", executable=[sys.executable, str(script)])

    async def go() -> None:
        engines = await launcher.ensure_engines(SPEC, 1, [], deadline_s=20)
        try:
            pid = engines[0].pid
            assert pid is not None
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert not any(secret.encode() in cmdline for secret in SECRETS)
            given = json.loads(next((tmp_path / "state" / "agents").glob("*.given")).read_text())
            assert (given["token"], given["key"], given["previous"]) == SECRETS
            assert not any(secret in arg for arg in given["argv"] for secret in SECRETS)
            assert "--token" not in given["argv"]
            assert "epak_" not in repr(SPEC)  # nor in a log line that prints the spec
        finally:
            await launcher.release(SPEC, engines)

    asyncio.run(go())


def test_the_agent_takes_its_token_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine_agent import main as agent_main

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("EPCTL_TOKEN", "from-the-environment")
    assert (
        agent_main.bearer_token(agent_main._parser().parse_args(["--token-file", str(token_file)])) == TOKEN
    )
    assert agent_main.bearer_token(agent_main._parser().parse_args([])) == "from-the-environment"
