"""One error-code style (kebab-case) for every code the agent and the coordinator's agent client write,
and one torch-free problem+json module that both sides import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine_agent.api import create_app
from engine_agent.problems import is_code

ROOT = Path(__file__).resolve().parents[2]

# Calls whose first string argument (or `type=`/`code=` keyword) is a machine-readable code.
CODE_CALLS = {"Conflict": 0, "ReconfigError": 0, "ProblemError": 1, "AgentError": None, "AgentProblem": 2}
CODE_KEYWORDS = {"type", "type_", "code"}


def codes_written_in(path: Path) -> list[tuple[int, str]]:
    """(line, code) for every literal code passed to a code-carrying call or class attribute `type`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name not in CODE_CALLS:
                continue
            position = CODE_CALLS[name]
            candidates = [k.value for k in node.keywords if k.arg in CODE_KEYWORDS]
            if position is not None and len(node.args) > position:
                candidates.append(node.args[position])
            found += [(node.lineno, c.value) for c in candidates if _is_text(c)]  # type: ignore[attr-defined]
        elif isinstance(node, ast.Assign | ast.AnnAssign) and _assigns_type(node) and _is_text(node.value):
            found.append((node.lineno, node.value.value))  # type: ignore[union-attr]
    return found


def _is_text(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _assigns_type(node: ast.Assign | ast.AnnAssign) -> bool:
    """`type = "..."` or `type: str = "..."` (a class's default code)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return any(isinstance(t, ast.Name) and t.id == "type" for t in targets)


def sources() -> list[Path]:
    return [*sorted((ROOT / "engine_agent").rglob("*.py")), ROOT / "app" / "agents" / "client.py"]


def test_the_style_check_accepts_kebab_case_only() -> None:
    assert is_code("policy-mismatch") and is_code("http-409") and is_code("starting")
    assert not is_code("policy_mismatch") and not is_code("PolicyMismatch") and not is_code("-x")


def test_the_scan_finds_codes_where_they_are_written() -> None:
    codes = {code for _, code in codes_written_in(ROOT / "engine_agent" / "reconfig" / "executor.py")}
    assert {"job-in-progress", "wrong-job", "already-committed", "pause-lease-expired"} <= codes


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_written_is_kebab_case(path: Path) -> None:
    bad = [(line, code) for line, code in codes_written_in(path) if not is_code(code)]
    assert bad == [], f"{path.relative_to(ROOT)}: codes not in kebab-case (line, code): {bad}"


@pytest.mark.processes  # a fresh interpreter: what importing the module alone pulls in
def test_the_shared_problem_module_imports_no_torch() -> None:
    probe = "import sys, engine_agent.problems, engine_agent.protocol; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "False"


def test_routing_errors_and_a_starting_agent_answer_kebab_case_problems() -> None:
    from engine_agent.auth import AgentKeys
    from engine_agent.gate import Guard

    app = create_app()  # no lifespan: the agent is never built, it is "starting"
    app.state.guard = Guard(AgentKeys(None, insecure=True))  # past the gate (an insecure agent's)
    client = TestClient(app)
    missing = client.get("/v1/nothing-here")
    wrong_method = client.delete("/v1/info")
    starting = client.get("/v1/info")
    for response, status, code in (
        (missing, 404, "not-found"),
        (wrong_method, 405, "method-not-allowed"),
        (starting, 503, "starting"),
    ):
        assert response.status_code == status
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == code and response.json()["type"] == f"urn:epctl:problem:{code}"
