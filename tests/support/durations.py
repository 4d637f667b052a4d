"""Where a run's time goes, kept in the repository: with `--durations-file PATH` (scripts/test gives
`tests/durations.md` for the whole suite, `tests/durations-fast.md` for `--fast`) the run ends by
writing the wall time, the time per folder and the 50 slowest tests (set-up + call + tear-down, with
their node ids), with the commit and the machine's load. Nothing is written without the option."""

from __future__ import annotations

import os
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

SLOWEST = 50


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--durations-file",
        default=None,
        help="write the run's wall time, time per folder and slowest tests to this file (markdown)",
    )


class Durations:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = time.monotonic()
        self.load_at_start = os.getloadavg()
        self.seconds: dict[str, float] = defaultdict(float)
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        if report.when == "call" or report.outcome != "passed":
            self.outcomes.setdefault(report.nodeid, report.outcome)
            if report.outcome != "passed":
                self.outcomes[report.nodeid] = report.outcome

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        wall = time.monotonic() - self.started
        folders: dict[str, list[float]] = defaultdict(list)
        for nodeid, seconds in self.seconds.items():
            parts = nodeid.split("::")[0].split("/")
            folders["/".join(parts[:2]) if len(parts) > 2 else parts[0]].append(seconds)
        counts: dict[str, int] = defaultdict(int)
        for outcome in self.outcomes.values():
            counts[outcome] += 1
        lines = [
            "# Test durations",
            "",
            f"Written by `tests/support/durations.py` at the end of a run (`{_args(session)}`), "
            f"{time.strftime('%Y-%m-%d %H:%M')}, commit {_commit()}.",
            "",
            f"- wall {wall:.0f} s ({wall / 60:.1f} min); {len(self.seconds)} tests: "
            + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
            f"- load (1/5/15 min) at the start {_load(self.load_at_start)}, "
            f"at the end {_load(os.getloadavg())} on {os.cpu_count()} cores",
            "",
            "## Per folder",
            "",
            "| folder | tests | seconds | share |",
            "|---|---:|---:|---:|",
        ]
        total = sum(self.seconds.values()) or 1.0
        for folder, times in sorted(folders.items(), key=lambda kv: -sum(kv[1])):
            lines.append(
                f"| `{folder}` | {len(times)} | {sum(times):.0f} | {100 * sum(times) / total:.0f}% |"
            )
        lines += ["", f"## The {SLOWEST} slowest tests", "", "| seconds | test |", "|---:|---|"]
        slowest = sorted(self.seconds.items(), key=lambda kv: -kv[1])[:SLOWEST]
        lines += [f"| {seconds:.1f} | `{nodeid}` |" for nodeid, seconds in slowest]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(lines) + "\n")


def _load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def _args(session: pytest.Session) -> str:
    args: list[str] = []
    skip = False
    for arg in session.config.invocation_params.args:
        if skip or arg.startswith("--durations-file"):
            skip = arg == "--durations-file"  # its value follows
            continue
        args.append(arg)
    return " ".join(["pytest", *args])


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--durations-file")
    if path:
        config.pluginmanager.register(Durations(Path(path)), "epctl-durations")
