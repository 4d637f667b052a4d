"""Layering: no import cycles among the modules of `app` and `engine_agent`, nor among the folders of
`app` (a folder imports another when any of its modules does).

Every import counts, wherever it is written (module level, inside a function, under
`if TYPE_CHECKING:`): modules that need each other are one module in two files, folders that need each
other are one folder in two. A cycle is reported with the modules (or folders) that form it. The
layer rules themselves (who may import whom) are import-linter contracts (`pyproject.toml`, checked by
`scripts/lint`).
"""

from __future__ import annotations

import ast
import functools
import gc
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine_agent")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The known modules `path` (module `name`) imports anywhere: at module level, inside functions
    and under `if TYPE_CHECKING:` alike (a cycle hidden behind a lazy import is still a cycle)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            # `from a.b import c` may name a module (a.b.c) or a name in a.b: keep the deepest module.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports; parsed once per test process (four tests read it, ~4 s each
    on the 2-core machine), each caller given its own copy."""
    return {name: set(targets) for name, targets in _parsed_import_graph().items()}


@functools.cache
def _parsed_import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    known = set(files)
    # CPython 3.11's ast.parse fails with "AST constructor recursion depth mismatch" when a garbage
    # collection runs a finalizer in the middle of it (seen after tests that leave event loops and
    # database engines to the collector): collect first and hold the collector off while parsing.
    gc.collect()
    gc.disable()
    try:
        return {name: imports_of(path, name, known) for name, path in files.items()}
    finally:
        gc.enable()


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def folder_of(module: str) -> str | None:
    """`app.<folder>` for a module inside a folder (a package) of `app`; None for anything else."""
    parts = module.split(".")
    if parts[0] != "app" or len(parts) < 2 or not (ROOT / "app" / parts[1]).is_dir():
        return None
    return f"app.{parts[1]}"


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder -> the other folders of `app` its modules import."""
    folders: dict[str, set[str]] = {}
    for module, imported in graph.items():
        source = folder_of(module)
        if source is None:
            continue
        targets = folders.setdefault(source, set())
        targets.update(t for t in map(folder_of, imported) if t is not None and t != source)
    return folders


# The arrows between folders of `app` that still close a cycle (each is one half of a two-way pair),
# why each is there, and so where it is to be cut. Every other cycle fails the test, and so does an
# arrow listed here that is gone (then delete its line): the list only shrinks. Measured for issue 23:
# at e2fc389 12 folders formed one cycle (13 two-way pairs), at d10930b 15 (17 pairs). Issue 33: 9 at
# 73a5b37, 5 once engines and incidents were deployments' sub-folders, 3 once the record floor asked no
# job (a deployment's liveness judged by its backend, the deployments API's job columns given to it).
ARROWS_LEFT = {
    ("app.api", "app.tokens"): "api.deps resolves a bearer token through the tokens service, and "
    "the tokens router uses api.deps",
    ("app.deployments", "app.launchers"): "a deployment's Ray settings shape lives with the Ray "
    "launcher (`app/launchers/ray_settings.py`), which reads the deployment's and engines' rows",
    ("app.jobs", "app.scale"): "POST /v1/reconfigurations refuses an autoscaler while autoscaling is "
    "paused, and an operator's job supersedes the standing intents (the router asks app/scale)",
}


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]


def test_imports_resolve_to_modules_wherever_they_are_written() -> None:
    graph = import_graph()
    assert "app.jobs.states" in graph["app.jobs.models"]  # module level
    assert "app.launchers.ray_launcher" in graph["app.launchers.registry"]  # inside a function
    assert "app.jobs.models" not in graph["app.jobs.states"]


def test_no_import_cycles_in_app_or_engine_agent() -> None:
    cycles = find_cycles(import_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_import_cycles_among_the_folders_of_app_but_the_arrows_left() -> None:
    folders = folder_graph(import_graph())
    gone = sorted(arrow for arrow in ARROWS_LEFT if arrow[1] not in folders.get(arrow[0], set()))
    assert gone == [], f"no longer imported, delete from ARROWS_LEFT: {gone}"
    kept = {
        source: targets - {t for s, t in ARROWS_LEFT if s == source} for source, targets in folders.items()
    }
    cycles = find_cycles(kept)
    assert cycles == [], "folder cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_every_arrow_left_closes_a_cycle() -> None:
    """An arrow on the list that no longer makes a cycle is an allowed import, not one left to cut."""
    folders = folder_graph(import_graph())
    for source, target in ARROWS_LEFT:
        assert any(source in group and target in group for group in find_cycles(folders)), (source, target)


@pytest.mark.processes
def test_the_coordinator_imports_no_torch() -> None:
    """`import app.main` (every router, the runner, both backends) leaves torch unloaded: the import
    contracts see only static imports, this sees what actually loads."""
    probe = "import sys, app.main; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "False", result.stderr
