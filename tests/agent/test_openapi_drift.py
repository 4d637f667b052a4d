"""The checked-in openapi/agent.json is what the code generates (regenerate:
`.venv/bin/python scripts/export_openapi.py`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _exporter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("export_openapi", ROOT / "scripts" / "export_openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_agent_document_matches_the_code() -> None:
    checked_in = (ROOT / "openapi" / "agent.json").read_text()
    assert _exporter().render("agent.json") == checked_in, (
        "openapi/agent.json is stale: run .venv/bin/python scripts/export_openapi.py"
    )


def test_the_agent_document_has_the_protocol_paths_with_problem_json_errors() -> None:
    document = json.loads(_exporter().render("agent.json"))
    paths = document["paths"]
    for phase in ("prepare", "sync", "pause", "switch", "resume", "abort"):
        post = paths[f"/v1/reconfig/{phase}"]["post"]
        assert "202" in post["responses"]
        assert list(post["responses"]["409"]["content"]) == ["application/problem+json"]
    assert {"/healthz", "/metrics", "/v1/info", "/v1/infer", "/v1/reconfig", "/v1/cleanup"} <= set(paths)
    assert paths["/v1/reconfig/prepare"]["post"]["operationId"] == "reconfig-prepare"
