"""The CLI's start-up cost: CPU time of `epctl --help`, `epctl jobs list` and `epctl jobs show JOB`.

Each command runs as a fresh process, the installed `epctl` console script, as a user runs it; the
CPU time (user + system) of that child comes from `os.wait4`, so waiting for the coordinator's
answer does not count. The children may write bytecode, as a normal installation has it (this
machine sets PYTHONDONTWRITEBYTECODE=1, which would compile every module of the checkout on every
start); one untimed run of each command writes it first. `jobs list` and `jobs show` talk to a real
coordinator (uvicorn on a SQLite file, runner off) holding a small history (a static deployment and a
few jobs moved through the state machine), so the table is really drawn. Two more rows show where the
time goes: the bare interpreter (`python -c pass`) and importing `app.cli.main` alone.

`--before PATH` runs the same commands against another checkout's code too (PYTHONPATH=PATH: e.g.
`git archive e383817 | tar -x -C /tmp/before`), interleaved with this one's run by run, so the
machine's load falls on both alike and the ratio holds even where the absolute times do not.

    .venv/bin/python benchmarks/cli.py                          # 15 runs of each command
    .venv/bin/python benchmarks/cli.py --runs 30 --before /tmp/before

Target: p50 CPU <= 0.3 s for each command (the issue's "start-up under ~0.3 s of CPU").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from common import ROOT, Coordinator, Report, scratch_dir, summarize

from tests.support.job_driver import JobDriver, create_static_deployment, drive_to_success
from tests.support.processes import epctl_command

TARGET_CPU_S = 0.3


def cpu_seconds(argv: Sequence[str], env: dict[str, str], cwd: Path) -> float:
    """User + system CPU of one run of `argv` (its own process and any it waits for). `cwd` is
    outside every checkout: `python -c` puts it first on sys.path, ahead of PYTHONPATH."""
    child = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        assert child.stderr is not None
        raise RuntimeError(f"{' '.join(argv)} exited {child.returncode}: {child.stderr.read().decode()}")
    return usage.ru_utime + usage.ru_stime


def seed_history(coordinator: Coordinator) -> str:
    """A static deployment and three finished jobs; the last job's id."""
    job_id = ""
    with coordinator.client() as api:
        create_static_deployment(api, "bench", engines=3)
        for target, pause_ms in ((3, 14.0), (2, 9.5), (3, 12.0)):
            created = api.post("/v1/reconfigurations", json={"deployment": "bench", "target_dp_size": target})
            created.raise_for_status()
            job_id = str(created.json()["id"])
            engines = ["bench-e0", "bench-e1", "bench-e2"]
            drive_to_success(JobDriver(coordinator.database_url, job_id), engines, pause_ms=pause_ms)
    return job_id


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--before", type=Path, help="another checkout whose CLI to measure beside this one")
    parser.add_argument("--name", default="cli", help="results file name")
    args = parser.parse_args()
    trees = {"now": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    report = Report(
        args.name,
        parameters={
            "runs": args.runs,
            "target_cpu_s": TARGET_CPU_S,
            "trees": {k: str(v) for k, v in trees.items()},
        },
    )
    data_dir = scratch_dir("cli")
    with Coordinator(f"sqlite:///{data_dir / 'cli.db'}", data_dir) as coordinator:
        job_id = seed_history(coordinator)
        base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        base_env.update(EPCTL_URL=coordinator.url, EPCTL_TOKEN=coordinator.admin_token)
        epctl = epctl_command()
        commands = {
            "python -c pass (the interpreter alone)": [sys.executable, "-c", "pass"],
            "import app.cli.main": [sys.executable, "-c", "import app.cli.main"],
            "epctl --help": [*epctl, "--help"],
            "epctl jobs list": [*epctl, "jobs", "list"],
            "epctl jobs show JOB": [*epctl, "jobs", "show", job_id],
        }
        runs = [(tree, name, argv, {**base_env, "PYTHONPATH": str(path)})
                for tree, path in trees.items() for name, argv in commands.items()]  # fmt: skip
        for _, _, argv, env in runs:  # warm the page cache and write the .pyc files once
            cpu_seconds(argv, env, data_dir)
        samples: dict[tuple[str, str], list[float]] = {(tree, name): [] for tree, name, _, _ in runs}
        for _ in range(args.runs):  # interleaved, so the machine's load falls on every row alike
            for tree, name, argv, env in runs:
                samples[(tree, name)].append(cpu_seconds(argv, env, data_dir) * 1000.0)
    rows = []
    for (tree, name), values in samples.items():
        stats = summarize(values)
        report.results.setdefault(tree, {})[name] = stats
        ratio: float | str = ""
        if tree == "now" and ("before", name) in samples:
            ratio = round(stats["p50"] / summarize(samples[("before", name)])["p50"], 2)
        rows.append([tree, name, stats["p50"], stats["p99"], stats["min"], stats["max"], ratio])
        if tree == "now" and name.startswith("epctl"):
            report.target(f"{name}: CPU p50", stats["p50"] / 1000.0, TARGET_CPU_S, "s")
    report.add_table(
        f"CPU time per run (ms, user + system, {args.runs} runs each, interleaved)",
        ["code", "command", "p50", "p99", "min", "max", "now / before (p50)"],
        rows,
    )
    report.targets_table()
    report.notes.append(
        "Each command is a fresh process; CPU from os.wait4 (user + system). On a loaded machine CPU time "
        "grows too (caches, frequency): the interleaved ratio is the steadier figure."
    )
    report.write()


if __name__ == "__main__":
    main()
