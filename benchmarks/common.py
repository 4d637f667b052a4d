"""Shared helpers for the benchmarks: processes, ports, statistics, tables, JSON and PNG output.

Every benchmark is one script (`.venv/bin/python benchmarks/NAME.py`); it prints a table, writes
`benchmarks/results/NAME.json` and draws `benchmarks/results/NAME.png`. Results are quoted as ratios
measured within one run, because the development machine is small (2 cores) and shared.

Processes (a coordinator, agents, helpers) come from the one harness the tests use,
`tests/support/processes.py`: benchmarks run from a checkout, so the repository root goes on the path.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.processes import (  # noqa: E402
    Child,
    Coordinator,
    free_port,
    spawn,
    stop_local_agents,
    wait_ready_file,
)
from tests.support.waiting import wait_until  # noqa: E402

__all__ = ["Child", "Coordinator", "free_port", "stop_local_agents", "wait_ready_file", "wait_until"]


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


# A benchmark stopped with SIGTERM runs its `finally` blocks: its coordinator and the engines it
# launched are stopped (engines outlive their coordinator by design, so nobody else would).
signal.signal(signal.SIGTERM, _exit_on_sigterm)
RESULTS_DIR = ROOT / "benchmarks" / "results"
TMP_DIR = RESULTS_DIR / "tmp"  # git-ignored scratch space (SQLite files, logs, ready files)
PYTHON = sys.executable

NOISE_NOTE = (
    "Measured on a small shared machine (2 CPU cores, other test suites running at the same time): "
    "absolute times are noisy; quote the ratios, which are taken within one run."
)


# ---------------------------------------------------------------------------------------------------
# ports and processes


class ProcessGroup:
    """Starts children and guarantees they are all stopped, whatever happens to the benchmark."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: list[Child] = []

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path = ROOT
    ) -> Child:
        """`argv` in its own process group (stopped group-wide), with this process's environment + `env`."""
        child = spawn(name, argv, self.log_dir / f"{name}.log", env={**os.environ, **(env or {})}, cwd=cwd)
        self.processes.append(child)
        return child

    def stop_all(self) -> None:
        for child in reversed(self.processes):
            child.stop(grace_s=5.0)
        self.processes.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def rss_mib(pid: int, include_children: bool = True) -> float:
    """Resident memory of a process (and its children, e.g. uvicorn's reloader-free worker)."""
    import psutil

    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    if include_children:
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
    return total / (1024 * 1024)


# ---------------------------------------------------------------------------------------------------
# statistics


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max / mean / n of a list of milliseconds (or any unit)."""
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "p50": round(percentile(samples, 50), 3),
        "p99": round(percentile(samples, 99), 3),
        "max": round(max(samples), 3),
        "min": round(min(samples), 3),
        "mean": round(statistics.fmean(samples), 3),
    }


def bootstrap_interval(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float] = statistics.fmean,
    *,
    confidence: float = 0.95,
    resamples: int = 4000,
    seed: int = 0,
) -> tuple[float, float]:
    """A percentile bootstrap interval of `statistic` over `values` (e.g. one figure per interleaved
    round, so the load's drift between rounds is in the spread): how far the figure moves with the
    noise. A fixed seed: the same figures give the same interval."""
    if not values:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    estimates = sorted(statistic(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1.0 - confidence) / 2.0 * 100.0
    return (percentile(estimates, tail), percentile(estimates, 100.0 - tail))


@contextlib.contextmanager
def stopwatch_ms(sink: list[float]) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        sink.append((time.perf_counter() - start) * 1000.0)


def timed_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return (time.perf_counter() - start) * 1000.0, value


# ---------------------------------------------------------------------------------------------------
# output


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (reads well in a terminal and pastes into the README)."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = [
        "| " + " | ".join(h.ljust(widths[i]) for i, h in enumerate(headers)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for row in cells:
        lines.append("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(row)) + " |")
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    with contextlib.suppress(Exception):
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    if "git_commit" not in info and os.environ.get("EPCTL_GIT_COMMIT"):
        info["git_commit"] = os.environ["EPCTL_GIT_COMMIT"]  # a copy of the tree without .git (GPU host)
    return info


@dataclass
class Report:
    """What one benchmark run writes: its parameters, its measurements, and its verdicts."""

    name: str
    command: str = field(default_factory=lambda: " ".join([".venv/bin/python", *sys.argv]))
    started_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    machine: dict[str, Any] = field(default_factory=machine_info)
    parameters: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    targets: list[dict[str, Any]] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=lambda: [NOISE_NOTE])

    def target(
        self,
        name: str,
        measured: float | None,
        limit: float,
        unit: str = "",
        why: str = "",
        at_least: bool = False,
        never: str = "never",
        interval: tuple[float, float] | None = None,
    ) -> bool | None:
        """Record a target and whether it was met (measured <= limit, or >= with `at_least`). `measured`
        None: it never happened (printed as `never`, missed), not a number standing in for it. With
        `interval` (the noise around `measured`, e.g. `bootstrap_interval`), a verdict only when the
        whole interval is on one side of the limit; otherwise "within noise" (`met` None)."""
        met: bool | None
        if measured is not None and interval is not None:
            low, high = interval
            inside, outside = (low >= limit, high < limit) if at_least else (high <= limit, low > limit)
            met = True if inside else False if outside else None
        else:
            met = measured is not None and (measured >= limit if at_least else measured <= limit)
        self.targets.append(
            {
                "target": name,
                "measured": round(measured, 4) if measured is not None else None,
                **({"shown": never} if measured is None else {}),
                **({"interval": [round(v, 4) for v in interval]} if interval is not None else {}),
                "limit": limit,
                "direction": ">=" if at_least else "<=",
                "unit": unit,
                "met": met,
                "verdict": "met" if met else "within noise" if met is None else "MISSED",
                **({"note": why} if why else {}),
            }
        )
        return met

    def add_table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
        text = f"### {title}\n\n{table(headers, rows)}\n"
        self.tables.append(text)
        print(text, flush=True)
        return text

    def targets_table(self) -> str:
        rows = [
            [
                t["target"],
                (t["shown"] if t.get("measured") is None else f"{fmt(t['measured'])} {t['unit']}".strip())
                + (f" ({fmt(t['interval'][0])} to {fmt(t['interval'][1])})" if t.get("interval") else ""),
                f"{t.get('direction', '<=')} {fmt(t['limit'])}",
                t.get("verdict") or ("met" if t["met"] else "MISSED"),
            ]
            for t in self.targets
        ]
        return self.add_table("Targets", ["target", "measured", "limit", "verdict"], rows)

    def write(self) -> Path:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{self.name}.json"
        payload = {
            "benchmark": self.name,
            "command": self.command,
            "started_at": self.started_at,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": self.machine,
            "parameters": self.parameters,
            "results": self.results,
            "targets": self.targets,
            "notes": self.notes,
        }
        path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        md = RESULTS_DIR / f"{self.name}.md"
        header = f"<!-- generated by: {self.command} at {self.started_at} -->\n\n"
        md.write_text(header + "\n".join(self.tables) + "\n" + "\n".join(f"- {n}" for n in self.notes) + "\n")
        print(f"wrote {path.relative_to(ROOT)} and {md.relative_to(ROOT)}", flush=True)
        return path


def new_figure(ncols: int = 1, width: float = 6.5, height: float = 4.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, axes[0]


def save_figure(fig: Any, name: str) -> Path:
    import matplotlib.pyplot as plt

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path.relative_to(ROOT)}", flush=True)
    return path


def scratch_dir(name: str) -> Path:
    path = TMP_DIR / f"{name}-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path
