"""The CLI's start-up cost: CPU time of `epctl --help`, `epctl jobs list` and `epctl jobs show JOB`.

Each command runs as a fresh process, the installed `epctl` console script, as a user runs it; the
CPU time (user + system) of that child comes from `os.wait4`. The children may write bytecode, as a
normal installation has it (this machine sets PYTHONDONTWRITEBYTECODE=1, which would compile every
module of the checkout on every start); one untimed run of each command writes it first. `jobs list`
and `jobs show` talk to a real coordinator (uvicorn on a SQLite file, runner off) holding a small
history (a static deployment and a few jobs moved through the state machine), so the table is really
drawn. The import table is what a fresh interpreter spends importing `app.cli.main` alone
(`-X importtime`), to show where the time goes.

    .venv/bin/python benchmarks/cli.py                # 15 runs of each command
    .venv/bin/python benchmarks/cli.py --runs 30 --name cli-before   # e.g. from an older checkout

Target: p50 CPU <= 0.3 s for each command (the issue's "start-up under ~0.3 s of CPU").
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence

from common import ROOT, Coordinator, Report, scratch_dir, summarize

from tests.cli.support import JobDriver, create_static_deployment, drive_to_success
from tests.support.processes import epctl_command

TARGET_CPU_S = 0.3


def cpu_seconds(argv: Sequence[str], env: dict[str, str]) -> float:
    """User + system CPU of one run of `argv` (its own process and any it waits for)."""
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        assert child.stderr is not None
        raise RuntimeError(f"{' '.join(argv)} exited {child.returncode}: {child.stderr.read().decode()}")
    return usage.ru_utime + usage.ru_stime


def import_ms(env: dict[str, str]) -> float:
    """Cumulative import time of `app.cli.main` in a fresh interpreter (microseconds -> ms)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import app.cli.main"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(row for row in done.stderr.splitlines() if re.search(r"\|\s*app\.cli\.main$", row))
    return int(line.split("|")[1]) / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--name", default="cli", help="results file name")
    args = parser.parse_args()
    report = Report(args.name, parameters={"runs": args.runs, "target_cpu_s": TARGET_CPU_S})
    data_dir = scratch_dir("cli")
    with Coordinator(f"sqlite:///{data_dir / 'cli.db'}", data_dir) as coordinator:
        with coordinator.client() as api:
            create_static_deployment(api, "bench", engines=3)
            job_id = ""
            for target, pause_ms in ((3, 14.0), (2, 9.5), (3, 12.0)):
                created = api.post(
                    "/v1/reconfigurations", json={"deployment": "bench", "target_dp_size": target}
                )
                created.raise_for_status()
                job_id = str(created.json()["id"])
                drive_to_success(
                    JobDriver(coordinator.database_url, job_id),
                    ["bench-e0", "bench-e1", "bench-e2"],
                    pause_ms=pause_ms,
                )
        env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
            "PYTHONPATH": str(ROOT),
            "EPCTL_URL": coordinator.url,
            "EPCTL_TOKEN": coordinator.admin_token,
        }
        epctl = epctl_command()
        commands = {
            "epctl --help": [*epctl, "--help"],
            "epctl jobs list": [*epctl, "jobs", "list"],
            "epctl jobs show JOB": [*epctl, "jobs", "show", job_id],
        }  # fmt: skip
        for argv in commands.values():  # warm the page cache and the .pyc files once
            cpu_seconds(argv, env)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):  # interleaved, so the machine's load falls on every command alike
            for name, argv in commands.items():
                samples[name].append(cpu_seconds(argv, env))
        imports = [import_ms(env) for _ in range(5)]
    rows = []
    for name, values in samples.items():
        stats = summarize([v * 1000.0 for v in values])
        rows.append([name, stats["p50"], stats["p99"], stats["min"], stats["max"]])
        report.results[name] = stats
        report.target(f"{name}: CPU p50", stats["p50"] / 1000.0, TARGET_CPU_S, "s")
    report.results["import_app_cli_main_ms"] = summarize(imports)
    report.add_table(
        f"CPU time per run (ms, user + system, {args.runs} runs each)",
        ["command", "p50", "p99", "min", "max"],
        rows,
    )
    report.add_table("Import of app.cli.main alone (ms, -X importtime)", ["p50", "min", "max"],
                     [[summarize(imports)["p50"], min(imports), max(imports)]])  # fmt: skip
    report.targets_table()
    report.notes.append(
        "Each command is a fresh `epctl` process; CPU from os.wait4 (user + system), so time spent waiting "
        "for the coordinator's answer does not count."
    )
    report.write()


if __name__ == "__main__":
    main()
