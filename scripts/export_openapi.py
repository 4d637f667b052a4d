"""Write (or, with --check, verify) the checked-in OpenAPI documents of the coordinator and the agent."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OPENAPI_DIR = ROOT / "openapi"


def _coordinator() -> dict[str, Any]:
    from app.main import create_app

    return create_app().openapi()


def _agent() -> dict[str, Any]:
    from engine_agent.main import create_app

    return create_app(fault_injection=True).openapi()  # the test-only route documented, marked so


DOCUMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "coordinator.json": _coordinator,
    "agent.json": _agent,
}


def render(name: str) -> str:
    return json.dumps(DOCUMENTS[name](), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    drifted = []
    for name in DOCUMENTS:
        path = OPENAPI_DIR / name
        text = render(name)
        if check:
            if not path.exists() or path.read_text() != text:
                drifted.append(name)
        else:
            OPENAPI_DIR.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if drifted:
        print(f"OpenAPI drift in {', '.join(drifted)}: run python scripts/export_openapi.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
