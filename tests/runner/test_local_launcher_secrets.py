"""Issue 17, finding 10 (and issue 25, the agent keys): a locally launched agent gets its bearer token
and its deployment's agent keys through its environment, never on its command line (which any local
user reads in /proc/<pid>/cmdline or `ps`). Issue 32: the previous key comes with its end, and the
environment is an allow-list: none of the coordinator's own secrets reach the engine.

Starts one stand-in agent process per test (through the real local launcher)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import time
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
    agent_key_previous_until=time.time() + 600,
)
SECRETS = (TOKEN, "epak_current-key-for-this-test", "epak_previous-key-for-this-test")
# The coordinator's own secrets, as its environment holds them.
COORDINATOR_SECRETS = {
    "EPCTL_ADMIN_TOKEN": "epctl_admin-secret-of-the-coordinator",
    "EPCTL_SECRET_KEY": "sealing-key-of-the-coordinator-0000000000000=",
    "DATABASE_URL": "postgresql+psycopg://epctl:db-password-of-the-coordinator@db/epctl",
    "EPCTL_HOOKS_INBOUND_SECRET": "whsec_inbound-secret-of-the-coordinator",
    "AWS_SECRET_ACCESS_KEY": "a-cloud-credential-of-the-host",
}

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
        given["until"] = os.environ.get("EPCTL_AGENT_KEY_PREVIOUS_UNTIL")
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
            assert float(given["until"]) == pytest.approx(SPEC.agent_key_previous_until, abs=0.01)
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


@pytest.mark.processes
def test_a_launched_agent_holds_none_of_the_coordinators_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/<pid>/environ of the launched process: its token, keys and the key's end, the platform's
    and its own settings; none of the coordinator's secrets (nor anything else not on the allow-list)."""
    for name, value in COORDINATOR_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setenv("EPCTL_AGENT_TORCH_THREADS", "1")
    script = tmp_path / "reporting_agent.py"
    script.write_text(REPORTING_AGENT)
    launcher = LocalLauncher(tmp_path / "state", executable=[sys.executable, str(script)])

    async def go() -> None:
        engines = await launcher.ensure_engines(SPEC, 1, [], deadline_s=20)
        try:
            pid = engines[0].pid
            assert pid is not None
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            environ = dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
            for name, value in COORDINATOR_SECRETS.items():
                assert name not in environ and value not in raw.decode(), name
            assert environ["EPCTL_TOKEN"] == TOKEN and environ["EPCTL_AGENT_KEY"] == SECRETS[1]
            assert (
                environ["EPCTL_AGENT_KEY_PREVIOUS"] == SECRETS[2]
                and "EPCTL_AGENT_KEY_PREVIOUS_UNTIL" in environ
            )
            assert environ["NCCL_DEBUG"] == "WARN" and environ["EPCTL_AGENT_TORCH_THREADS"] == "1"
            assert environ["PATH"] == os.environ["PATH"]
        finally:
            await launcher.release(SPEC, engines)

    asyncio.run(go())


def test_a_previous_key_without_its_end_is_not_given() -> None:
    from app.launchers.local import agent_environment

    spec = LaunchSpec(
        deployment="demo", engine=SPEC.engine, agent_key=SECRETS[1], agent_key_previous=SECRETS[2]
    )
    env = agent_environment(
        spec, base={"PATH": "/bin", "EPCTL_AGENT_KEY_PREVIOUS": "stale-from-the-coordinator"}
    )
    assert env == {"PATH": "/bin", "EPCTL_AGENT_KEY": SECRETS[1]}
