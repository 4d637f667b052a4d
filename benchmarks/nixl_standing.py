"""What a background job's prepare costs the clients of the EP group, with and without the engines'
standing NIXL agent (`engine_agent/transfer/nixl_standing.py`, issue 39's note).

Real processes: a uvicorn coordinator (job runner on, SQLite) whose local launcher starts reference
engines (NIXL weight transfer); the coordinator's canary probe measures what a client saw in every
phase of each job. Per block: a fresh stack with `EPCTL_NIXL_STANDING_AGENT` 0 (one agent built and
destroyed per channel, as before) or 1 (the standing agent lent to each channel), scaled 0 -> 2, then
`--cycles` times 2 -> 3 -> 2 in background; the figure is the 3 -> 2 job's longest canary gap in its
prepare phase (every engine opens a channel there while the group serves). Blocks alternate between
the two settings (`--rounds` of off/on, the order flipped every round) so load drift hits both alike;
`--append` adds this run's samples to the last run's (several holds of the machine lock).

    .venv/bin/python benchmarks/nixl_standing.py --rounds 1 --cycles 3
    .venv/bin/python benchmarks/nixl_standing.py --rounds 1 --cycles 3 --append

Target: the median prepare gap with the standing agent <= half of the one without (the stall came
from building and destroying agents beside the serving loop).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from common import RESULTS_DIR, Report, percentile, scratch_dir

from tests.support.databases import sqlite_database
from tests.support.stack import StackCoordinator

NAME = "nixl_standing"
MODES = {"off": "0", "on": "1"}


def load() -> float:
    return round(os.getloadavg()[0], 2)


def idle_cpu_pct(data_dir: Path, seconds: float = 5.0) -> float:
    """The serving engines' CPU (user + system, % of one core, summed) over `seconds` with no request
    and no job: the standing agent's progress thread is the difference between the two settings."""

    def ticks() -> int:
        total = 0
        for entry in json.loads((data_dir / "local-agents.json").read_text()).values():
            with contextlib.suppress(OSError, KeyError, TypeError):
                fields = Path(f"/proc/{entry['pid']}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        return total

    time.sleep(1.0)
    before, started = ticks(), time.monotonic()
    time.sleep(seconds)
    spent = (ticks() - before) / os.sysconf("SC_CLK_TCK")
    return round(100.0 * spent / (time.monotonic() - started), 1)


def run_block(mode: str, cycles: int, directory: Path, idle: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One stack with the standing agent `mode`; returns each background job's probe figures (and adds
    the idle engines' CPU to `idle`)."""
    block_dir = directory / f"{mode}-{time.monotonic_ns()}"
    block_dir.mkdir(parents=True)
    coordinator = StackCoordinator(sqlite_database(block_dir, migrated=True), block_dir / "data")
    samples: list[dict[str, Any]] = []
    try:
        coordinator.start(ready_timeout_s=90.0, EPCTL_NIXL_STANDING_AGENT=MODES[mode])
        coordinator.create_deployment("demo")
        first = coordinator.wait_job(coordinator.scale(2))
        assert first["state"] == "succeeded", first
        idle.append(
            {"mode": mode, "engines_idle_core_pct": idle_cpu_pct(coordinator.data_dir), "loadavg": load()}
        )
        print(json.dumps(idle[-1]), flush=True)
        for _ in range(cycles):
            for target in (3, 2):
                job = coordinator.wait_job(coordinator.scale(target, strategy="background"))
                assert job["state"] == "succeeded", job
                probe = job["probe"] or {}
                phases = probe.get("phases", {})
                prepare = phases.get("prepare", {})
                samples.append(
                    {
                        "mode": mode,
                        "job": f"{job['from_dp_size']}->{job['to_dp_size']}",
                        "transfer_backends": sorted(
                            {str(r.get("transfer_backend")) for r in job.get("engine_results", [])}
                        ),
                        "prepare_longest_gap_ms": prepare.get("longest_gap_ms"),
                        "prepare_p99_ms": prepare.get("p99_ms"),
                        "prepare_ms": prepare.get("duration_ms"),
                        "before_p99_ms": phases.get("before", {}).get("p99_ms"),
                        "client_outage_ms": job.get("client_outage_ms"),
                        "downtime_ms": job.get("downtime_ms"),
                        "loadavg": load(),
                    }
                )
                print(json.dumps(samples[-1]), flush=True)
    finally:
        coordinator.close()
    return samples


def ratio_interval(on: list[float], off: list[float], resamples: int = 4000) -> tuple[float, float]:
    """A percentile bootstrap interval (95%) of median(on) / median(off), each side resampled alone."""
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(on, k=len(on))) / statistics.median(rng.choices(off, k=len(off)))
        for _ in range(resamples)
    )
    return (percentile(ratios, 2.5), percentile(ratios, 97.5))


def summarize(samples: list[dict[str, Any]], mode: str, job: str, key: str) -> list[float]:
    return [s[key] for s in samples if s["mode"] == mode and s["job"] == job and s[key] is not None]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=1, help="off/on block pairs")
    parser.add_argument("--cycles", type=int, default=3, help="2 -> 3 -> 2 cycles per block")
    parser.add_argument("--append", action="store_true", help="add to the samples of the last run")
    args = parser.parse_args()
    report = Report(NAME)
    report.parameters = {"rounds": args.rounds, "cycles": args.cycles, "append": args.append}
    previous: list[dict[str, Any]] = []
    idle: list[dict[str, Any]] = []
    path = RESULTS_DIR / f"{NAME}.json"
    if args.append and path.exists():
        previous = json.loads(path.read_text())["results"]["samples"]
        idle = json.loads(path.read_text())["results"].get("idle", [])
    directory = scratch_dir(NAME)
    samples = list(previous)
    rounds_before = len(idle) // 2
    for round_ in range(args.rounds):
        # The order flips every round, counting the rounds of the runs appended to (two blocks each).
        order = ["off", "on"] if (round_ + rounds_before) % 2 == 0 else ["on", "off"]
        for mode in order:
            samples.extend(run_block(mode, args.cycles, directory, idle))
    rows = []
    for job in ("2->3", "3->2"):
        for mode in ("off", "on"):
            gaps = summarize(samples, mode, job, "prepare_longest_gap_ms")
            p99 = summarize(samples, mode, job, "prepare_p99_ms")
            if not gaps:
                continue
            rows.append(
                [
                    job,
                    mode,
                    len(gaps),
                    round(statistics.median(gaps), 1),
                    round(max(gaps), 1),
                    round(statistics.median(p99), 1) if p99 else None,
                    " ".join(f"{g:.0f}" for g in gaps),
                ]
            )
    report.add_table(
        "Longest canary gap in a background job's prepare (ms), standing NIXL agent off / on",
        ["job", "standing agent", "n", "median gap", "worst gap", "median p99", "all gaps"],
        rows,
    )
    off = summarize(samples, "off", "3->2", "prepare_longest_gap_ms")
    on = summarize(samples, "on", "3->2", "prepare_longest_gap_ms")
    report.results = {"samples": samples, "idle": idle}
    idle_rows = [
        [mode, len(cpu), round(statistics.median(cpu), 1), " ".join(f"{c:.1f}" for c in cpu)]
        for mode in ("off", "on")
        if (cpu := [i["engines_idle_core_pct"] for i in idle if i["mode"] == mode])
    ]
    if idle_rows:
        report.add_table(
            "Two idle serving engines' CPU, % of one core (5 s, no request, no job)",
            ["standing agent", "n", "median", "all"],
            idle_rows,
        )
    if off and on:
        ratio = statistics.median(on) / statistics.median(off)
        interval = ratio_interval(on, off) if len(off) >= 3 and len(on) >= 3 else None
        report.target(
            "3->2 background prepare: median longest gap, standing / per-channel",
            ratio,
            0.5,
            "x",
            "the stall came from building and destroying NIXL agents beside the serving loop",
            interval=interval,
        )
    report.targets_table()
    report.notes.append(
        "Load: the 1-minute load average at each job is in the samples (`loadavg`); 2 cores, shared."
    )
    report.write()


if __name__ == "__main__":
    main()
