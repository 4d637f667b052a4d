"""Per-layer expert placement: balance against a fresh rebalance, weight copies against the lower bound,
and time per plan (`engine_agent.layer_placement.rebalance_layers`).

Shapes (layers x logical experts + redundant, ranks): a DeepSeek-V3-like 58 x 256 + 32 and two smaller
ones. Each starts from a fresh placement, then scales 64 -> 65 -> 63 (two middle ranks retired) -> 62
(the middle rank retired), each plan starting from the previous one; then the same size again under
+-20% load noise. Loads are skewed
(a Zipf-like profile, each layer its own permutation of the hot experts, +-20% per expert) with a fixed
seed.

- balance: mean / max rank load per layer; the verdict takes the worst layer's ratio to the project's
  fresh rebalance (`engine_agent.placement.rebalance`, per layer).
- copies: (layer, rank, expert) the new placement needs that the engine did not hold. The lower bound
  is the fewest copies any placement with the fresh replica counts needs (an expert needs one for each
  replica beyond the ranks that keep it, a rank one for each slot beyond the experts it keeps).
  `naive` is the fresh placement as is (what the planner did before), `matched` the fresh placement
  with its ranks matched to the old ones by overlap.
- time: median wall time of `rebalance_layers` over --reps runs (the fresh per-layer Python
  rebalance is timed once for reference).

    .venv/bin/python benchmarks/placement.py
    .venv/bin/python benchmarks/placement.py --reps 3 --shapes small

Targets: balance >= 0.98x fresh on every layer; copies <= 1.5x the lower bound for +-1 rank (64 -> 65,
63 -> 62; 65 -> 63 is reported); a 58 x 256 x 64 plan <= 50 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np
from common import Report

from engine_agent.layer_moves import held_pairs
from engine_agent.layer_placement import (
    _match_by_overlap,
    copies_moved,
    layer_balance,
    normalized_loads,
    origin_held,
    rebalance_layers,
)
from engine_agent.placement import rebalance

BALANCE_TARGET = 0.98
COPIES_TARGET = 1.5
TIME_TARGET_MS = 50.0


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    experts: int
    redundant: int
    sizes: tuple[int, int, int]  # start, one up, one below start


SHAPES = {
    "deepseek": Shape("58x256+32", 58, 256, 32, (64, 65, 63)),
    "medium": Shape("24x128+16", 24, 128, 16, (16, 17, 15)),
    "small": Shape("4x16+4", 4, 16, 4, (4, 5, 3)),
}


def skewed_loads(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    profile = 1000.0 / np.arange(1, shape.experts + 1) ** 1.0
    return np.stack(
        [rng.permutation(profile) * rng.uniform(0.8, 1.2, shape.experts) for _ in range(shape.layers)]
    )


def python_fresh(loads: np.ndarray, redundant: int, world: int) -> tuple[np.ndarray, float]:
    """The project's per-layer rebalance (pure Python): placement and its time in ms."""
    start = time.perf_counter()
    placement = np.array([rebalance(layer.tolist(), redundant, world) for layer in loads])
    return placement, (time.perf_counter() - start) * 1000


def timed_plan(reps: int, **kwargs: object) -> tuple[object, float, float]:
    """The plan, and the median and best wall time of `reps` runs (ms)."""
    times = []
    plan = None
    for _ in range(reps):
        start = time.perf_counter()
        plan = rebalance_layers(**kwargs)  # type: ignore[arg-type]
        times.append((time.perf_counter() - start) * 1000)
    return plan, statistics.median(times), min(times)


def run_shape(shape: Shape, reps: int, report: Report, seed: int) -> list[list[object]]:
    rng = np.random.default_rng(seed)
    loads = normalized_loads(skewed_loads(shape, rng))
    start, up, down = shape.sizes
    leaving = [start // 3, (2 * start) // 3]  # two middle ranks leave on the way down (retire)
    steps: list[tuple[str, int, list[int | None] | None, np.ndarray]] = [
        (f"{start} -> {up}", up, None, loads),
        (f"{up} -> {down}", down, [r for r in range(up) if r not in leaving], loads),
    ]
    noisy = normalized_loads(loads * rng.uniform(0.8, 1.2, loads.shape))
    # One rank fewer: the middle rank leaves.
    steps.append((f"{down} -> {down - 1}", down - 1, [r for r in range(down) if r != down // 2], loads))
    steps.append((f"{down - 1} -> {down - 1}, +-20% load", down - 1, None, noisy))

    previous, first_ms, _ = timed_plan(
        reps, expert_load=loads, num_redundant=shape.redundant, world_size=start
    )
    rows: list[list[object]] = []
    results = report.results.setdefault(shape.name, {"fresh_plan_ms": round(first_ms, 2), "steps": []})
    current = previous.placement  # type: ignore[attr-defined]
    for label, world, origin, step_loads in steps:
        plan, plan_ms, best_ms = timed_plan(
            reps,
            expert_load=step_loads,
            num_redundant=shape.redundant,
            world_size=world,
            previous=current,
            origin=origin,
        )
        fresh, python_ms = python_fresh(step_loads, shape.redundant, world)
        fresh_balance = layer_balance(fresh, step_loads)
        worst = float((plan.balance / fresh_balance).min())  # type: ignore[attr-defined]
        kept = origin_held(
            current, origin or [r if r < current.shape[1] else None for r in range(world)], shape.experts
        )
        naive = copies_moved(fresh, kept)
        matched = copies_moved(
            np.stack([_match_by_overlap(fresh[layer], kept[layer]) for layer in range(shape.layers)]), kept
        )
        pairs = int(held_pairs(plan.placement, shape.experts).sum())  # type: ignore[attr-defined]
        copies, bound = plan.copies_moved, plan.lower_bound  # type: ignore[attr-defined]
        ratio = copies / bound if bound else (1.0 if copies == 0 else float("inf"))
        results["steps"].append(
            {
                "step": label,
                "world": world,
                "worst_layer_balance_vs_fresh": round(worst, 4),
                "mean_balance": round(float(plan.balance.mean()), 4),  # type: ignore[attr-defined]
                "mean_fresh_balance": round(float(fresh_balance.mean()), 4),
                "copies": copies,
                "lower_bound": bound,
                "copies_vs_bound": round(ratio, 3),
                "pairs": pairs,
                "naive_copies": naive,
                "matched_copies": matched,
                "fallback_layers": plan.fallback_layers,  # type: ignore[attr-defined]
                "plan_ms": round(plan_ms, 2),
                "plan_best_ms": round(best_ms, 2),
                "python_fresh_ms": round(python_ms, 1),
                "plan_vs_python_fresh": round(plan_ms / python_ms, 3) if python_ms else None,
            }
        )
        rows.append(
            [
                shape.name,
                label,
                f"{worst:.4f}",
                f"{copies} ({100 * copies / pairs:.1f}%)",
                bound,
                f"{ratio:.2f}",
                f"{naive} ({100 * naive / pairs:.1f}%)",
                matched,
                f"{plan_ms:.1f} ({best_ms:.1f})",
                f"{python_ms:.0f}",
                f"{plan_ms / python_ms:.2f}" if python_ms >= 1 else "-",
            ]
        )
        report.target(
            f"{shape.name} {label}: worst layer balance vs fresh", worst, BALANCE_TARGET, "x", at_least=True
        )
        if abs(world - current.shape[1]) == 1:  # the copies target is for one rank more or fewer
            report.target(f"{shape.name} {label}: copies vs lower bound", ratio, COPIES_TARGET, "x")
        if shape.layers == 58 and "load" not in label:
            report.target(
                f"{shape.name} {label}: plan time (median of {reps})", plan_ms, TIME_TARGET_MS, "ms"
            )
        current = plan.placement  # type: ignore[attr-defined]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="+", choices=sorted(SHAPES), default=["deepseek", "medium", "small"]
    )
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="placement", help="result file name under benchmarks/results/")
    args = parser.parse_args()

    report = Report(args.name)
    report.parameters = {
        "shapes": {key: SHAPES[key].__dict__ for key in args.shapes},
        "reps": args.reps,
        "seed": args.seed,
        "load": "Zipf 1/rank, a permutation per layer, x U(0.8, 1.2) per expert; noise step x U(0.8, 1.2)",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    rows: list[list[object]] = []
    for key in args.shapes:
        rows += run_shape(SHAPES[key], args.reps, report, args.seed)
    report.add_table(
        "Placement per step (each plan starts from the previous one)",
        [
            "shape",
            "step",
            "worst balance vs fresh",
            "copies (of pairs)",
            "lower bound",
            "copies / bound",
            "naive fresh copies",
            "matched fresh copies",
            "plan ms, median (best)",
            "python fresh ms",
            "plan / python fresh",
        ],
        rows,
    )
    report.targets_table()
    report.notes.append(
        "The lower bound counts the copies forced by the change for the fresh replica counts; it ignores "
        "balance, so a shrink that must spread the leavers' load over every survivor moves more."
    )
    report.notes.append(
        "Times are wall clock on the shared machine (its load average is in the parameters); the ratio to "
        "the per-layer Python rebalance, timed in the same run, does not depend on the load. The issue "
        "measured that Python rebalance at 221-289 ms for 58 x 256 x 64 on a quieter day."
    )
    report.notes.append(
        "Copies / bound can fall below 1: the bound assumes the fresh replica counts, and a plan that "
        "keeps every old pair may use other counts (it still meets the balance)."
    )
    report.write()


if __name__ == "__main__":
    main()
