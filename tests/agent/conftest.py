"""Agent processes for the multi-process tests: started on loopback, always stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.driver import AgentProcess, start_agents, stop_agents
from tests.support.agent_zygote import Zygote


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
