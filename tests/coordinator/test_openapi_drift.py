"""The checked-in openapi/coordinator.json is what the code generates (regenerate:
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


def test_the_checked_in_coordinator_document_matches_the_code() -> None:
    checked_in = (ROOT / "openapi" / "coordinator.json").read_text()
    assert _exporter().render("coordinator.json") == checked_in, (
        "openapi/coordinator.json is stale: run .venv/bin/python scripts/export_openapi.py"
    )


def test_operation_ids_read_as_tag_and_name() -> None:
    document = json.loads(_exporter().render("coordinator.json"))
    ids = {op["operationId"] for path in document["paths"].values() for op in path.values()}
    assert {
        "reconfigurations-create",
        "reconfigurations-cancel",
        "engines-register",
        "deployments-list",
    } <= ids


def test_errors_are_documented_as_problem_json() -> None:
    document = json.loads(_exporter().render("coordinator.json"))
    conflict = document["paths"]["/v1/reconfigurations"]["post"]["responses"]["409"]["content"]
    assert list(conflict) == ["application/problem+json"]
