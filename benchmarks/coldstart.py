"""The coordinator's cold start: how long `epctl serve` takes to answer `/readyz`, quiet and under load.

A restart is on the path of every recovery, so it must be short. For each condition (`quiet`, and
`loaded`: 2 busy processes per core beside it) and repetition:

- `import app.main` in a fresh interpreter (wall time, and what `-X importtime` attributes to it);
- `epctl serve` on an empty SQLite database (the first start: the migration runs) to its first 200
  from `/readyz`, and on that database again (a restart: at head already);
- the anchor: a bare `python -c pass` (the interpreter's own start, which no code of ours can cut).

Run: `.venv/bin/python benchmarks/coldstart.py [--reps 5]`. Writes benchmarks/results/coldstart.json
and .md. Target (issue 22): `/readyz` within 2 s of the start on a quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from common import PYTHON, Report, free_port, scratch_dir  # puts the checkout on the path

from tests.support.processes import clean_environment, epctl_command

ADMIN_TOKEN = "coldstart-admin-token-0123456789"


def interpreter_start_s() -> float:
    started = time.perf_counter()
    subprocess.run([PYTHON, "-c", "pass"], check=True)
    return time.perf_counter() - started


def import_s() -> tuple[float, float]:
    """(wall seconds of `import app.main` in a fresh interpreter, importtime's cumulative figure)."""
    started = time.perf_counter()
    done = subprocess.run(
        [PYTHON, "-X", "importtime", "-c", "import app.main"], check=True, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    found = re.search(r"\|\s+(\d+) \| app\.main$", done.stderr, re.M)
    return wall, (int(found.group(1)) / 1e6 if found else float("nan"))


def serve_until_ready_s(data_dir: Path) -> float:
    """`epctl serve` on `data_dir`'s SQLite database, from the spawn to its first `/readyz` 200."""
    port = free_port()
    env = clean_environment(
        {"EPCTL_DATA_DIR": str(data_dir), "EPCTL_ADMIN_TOKEN": ADMIN_TOKEN, "EPCTL_LOG_FORMAT": "text"}
    )
    started = time.perf_counter()
    child = subprocess.Popen(
        [*epctl_command(), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1.0).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            if child.poll() is not None:
                raise RuntimeError(f"epctl serve exited with {child.returncode}")
            if time.perf_counter() - started > 120:
                raise RuntimeError("epctl serve not ready within 120 s")
            time.sleep(0.01)
    finally:
        child.terminate()
        child.wait(timeout=30)


@contextmanager
def load(processes: int) -> Iterator[None]:
    """`processes` busy loops beside the measurement (a loaded host)."""
    busy = [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        time.sleep(1.0)
        yield
    finally:
        for child in busy:
            child.kill()
            child.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--name", default="coldstart")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))  # taskset narrows it: the cores this run may use
    report = Report(args.name, parameters={**vars(args), "cores": cores})
    scratch = scratch_dir("coldstart")
    results: dict[str, dict[str, list[float]]] = {}
    rows = []
    for condition, busy in (("quiet", 0), ("loaded", 2 * cores)):
        figures: dict[str, list[float]] = {
            "interpreter": [],
            "import": [],
            "importtime": [],
            "first": [],
            "restart": [],
        }
        with load(busy):
            for rep in range(args.reps):
                figures["interpreter"].append(interpreter_start_s())
                wall, attributed = import_s()
                figures["import"].append(wall)
                figures["importtime"].append(attributed)
                data_dir = scratch / f"{condition}-{rep}"
                figures["first"].append(serve_until_ready_s(data_dir))
                figures["restart"].append(serve_until_ready_s(data_dir))
        results[condition] = figures
        for figure, label in (
            ("interpreter", "`python -c pass` (anchor)"),
            ("import", "`import app.main`, fresh interpreter"),
            ("importtime", "... of which importtime attributes to app.main"),
            ("first", "`epctl serve` to /readyz, empty database"),
            ("restart", "`epctl serve` to /readyz, restart"),
        ):
            values = figures[figure]
            rows.append([condition, label, statistics.median(values), min(values), max(values)])
        print(f"{condition}: {figures}", flush=True)
    report.results = results
    report.add_table(
        f"Coordinator cold start, seconds ({args.reps} repetitions; loaded: {2 * cores} busy processes on "
        f"{cores} cores)",
        ["condition", "figure", "median", "min", "max"],
        rows,
    )
    for figure, label in (("first", "empty database"), ("restart", "restart")):
        report.target(
            f"quiet: `epctl serve` to /readyz, {label} (median)",
            statistics.median(results["quiet"][figure]),
            2.0,
            "s",
            why="a restart is on the path of every recovery (issue 22)",
        )
    report.targets_table()
    report.notes.append(
        "The anchor is the interpreter's own start; `import app.main` is what the coordinator's code costs "
        "on top of it (torch, numpy, Ray and vLLM are kept out: tests/test_coordinator_start.py)."
    )
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
