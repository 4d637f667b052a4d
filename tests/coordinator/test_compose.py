"""docker-compose.yml parses and wires the coordinator to Postgres and two agents to the coordinator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(document, dict)
    return document


def test_compose_runs_the_coordinator_on_postgres() -> None:
    services = _compose()["services"]
    assert {"coordinator", "postgres", "agent-1", "agent-2"} <= set(services)
    coordinator = services["coordinator"]
    assert coordinator["environment"]["DATABASE_URL"].startswith("postgresql+psycopg://")
    assert coordinator["command"][:2] == ["epctl", "serve"]
    assert "postgres" in coordinator["depends_on"]


def test_compose_agents_register_with_the_coordinator() -> None:
    services = _compose()["services"]
    for name in ("agent-1", "agent-2"):
        command = services[name]["command"]
        assert command[0] == "epctl-agent"
        assert command[command.index("--coordinator") + 1] == "http://coordinator:8000"
        assert command[command.index("--deployment") + 1] == "demo"


def test_the_image_builds_from_the_dockerfile() -> None:
    assert _compose()["services"]["coordinator"]["build"] == "."
    assert (ROOT / "Dockerfile").read_text().count("epctl") >= 1
