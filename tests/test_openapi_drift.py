"""The checked-in OpenAPI documents are what the code generates (regenerate:
`.venv/bin/python scripts/export_openapi.py`)."""

from __future__ import annotations

import pytest

from tests.support.openapi import ROOT, render


@pytest.mark.parametrize("name", ["coordinator.json", "agent.json"])
def test_the_checked_in_document_matches_the_code(name: str) -> None:
    checked_in = (ROOT / "openapi" / name).read_text()
    stale = f"openapi/{name} is stale: run .venv/bin/python scripts/export_openapi.py"
    assert render(name) == checked_in, stale
