"""The coordinator starts fast: its import path keeps the heavy modules out (torch, numpy, Ray, vLLM).

A restart is on the path of every recovery (a coordinator that answers late makes agents and operators
wait), so what `import app.main` pulls in is checked in a fresh interpreter: torch alone costs more than
a whole coordinator start (1.1-1.4 s here). numpy waits for the first plan, Ray for the first Ray
launch. The time itself is measured by `benchmarks/coldstart.py`, never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "numpy", "ray", "vllm", "nixl", "transformers")


@pytest.mark.processes
def test_importing_the_coordinator_imports_none_of_the_heavy_modules() -> None:
    probe = "import json, sys, app.main; print(json.dumps(sorted(sys.modules)))"
    loaded = set(
        json.loads(
            subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
        )
    )
    assert [name for name in HEAVY if name in loaded] == []
