"""Agent processes for the multi-process tests: started on loopback, always stopped."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.driver import AgentProcess, start_agents, stop_agents
from tests.support.agent_zygote import Zygote
from tests.support.processes import AGENT_KEY


@pytest.fixture(scope="session")
def agent_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    """One warmed interpreter per session that the agents of `spawn_agents` are forked from."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "EPCTL_AGENT_KEY": AGENT_KEY}
    zygote = Zygote(tmp_path_factory.mktemp("agent-zygote"), env)
    yield zygote
    zygote.close()


@pytest.fixture
def spawn_agents(tmp_path: Path, agent_zygote: Zygote) -> Iterator[Callable[..., list[AgentProcess]]]:
    """spawn_agents(n, first=0) starts n agents e{first}.. (forked from the session's warmed
    interpreter); all are stopped when the test ends (and their logs printed if it failed)."""
    started: list[AgentProcess] = []

    def spawn(count: int, first: int = 0, **options: object) -> list[AgentProcess]:
        options.setdefault("zygote", agent_zygote)
        agents = start_agents(count, tmp_path, first=first, **options)  # type: ignore[arg-type]
        started.extend(agents)
        return agents

    yield spawn
    stop_agents(started)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    funcargs: dict[str, Any] = getattr(item, "funcargs", {})
    if report.when == "call" and report.failed:
        logs = sorted(Path(funcargs["tmp_path"]).glob("*.log")) if "tmp_path" in funcargs else []
        for log in logs:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            report.sections.append((f"agent log {log.name}", tail))
