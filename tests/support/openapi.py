"""The OpenAPI exporter (`scripts/export_openapi.py`), loaded as a module for the tests."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def render(name: str) -> str:
    """The document `name` ("coordinator.json" or "agent.json") as the code generates it now."""
    spec = importlib.util.spec_from_file_location("export_openapi", ROOT / "scripts" / "export_openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text: str = module.render(name)
    return text


def document(name: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(render(name))
    return parsed
