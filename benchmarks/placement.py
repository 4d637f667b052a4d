"""Per-layer placement: coverage, balance, weight copies and plan time, for our plan with coverage,
the same plan without coverage, and vLLM's EPLB policy, each step starting from its own previous
placement (`engine_agent.layer_placement.rebalance_layers`; vLLM's policy copied in
`benchmarks/vllm_eplb_policy.py`, so no vLLM install is needed).

Shapes (layers x logical experts + redundant, ranks): a DeepSeek-V3-like 58 x 256 + 32 (one engine per
host, and 8 engines per host), a 24 x 128 + 128 case where the slots hold two replicas of every
expert, and two smaller ones. Each starts from a fresh placement, then scales 64 -> 65 -> 63 (two
middle ranks retired) -> 62 (the middle rank retired), each plan starting from the previous one; then
the same size again under +-20% load noise. Loads are skewed (a Zipf-like profile, each layer its own
permutation of the hot experts, +-20% per expert) with a fixed seed.

- coverage: (layer, expert) pairs whose replicas one engine loss (`at risk`), or one host loss where
  engines share hosts (`host`), would take; covered = none.
- balance: mean / max rank load per layer; `worst` is the worst layer's ratio to the project's fresh
  rebalance (`engine_agent.placement.rebalance`, per layer).
- copies: (layer, rank, expert) the new placement needs that the engine did not hold; the lower bound
  is the fewest copies any placement with the fresh replica counts needs.
- vLLM's policy: `DefaultEplbPolicy.rebalance_experts` with the same slots (ranks x slots per rank),
  one node, its old placement passed when the size is unchanged; its ranks keep the order ours do.
- time: median wall time over --reps runs, ours and vLLM's interleaved in the same loop.

    flock /work/wt/.machine.lock .venv/bin/python benchmarks/placement.py
    .venv/bin/python benchmarks/placement.py --reps 3 --shapes small

Targets: the plan without coverage keeps >= 0.98x the fresh balance on every layer and <= 1.5x the
copy bound for +-1 rank; with coverage, its worst-layer balance is >= 0.97x the plan's without
coverage on the DeepSeek-sized case; a DeepSeek-sized plan (either) takes no longer than vLLM's
policy in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from common import Report
from vllm_eplb_policy import DefaultEplbPolicy

from engine_agent.layer_coverage import coverage_of
from engine_agent.layer_fresh import held_pairs
from engine_agent.layer_placement import (
    copies_moved,
    layer_balance,
    normalized_loads,
    origin_held,
    rebalance_layers,
)
from engine_agent.placement import rebalance, slots_per_rank

BALANCE_TARGET = 0.98
COVERAGE_COST_TARGET = 0.97
COPIES_TARGET = 1.5


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    experts: int
    redundant: int
    sizes: tuple[int, int, int]  # start, one up, one below start
    per_host: int = 1  # engines per host (failure domain)


SHAPES = {
    "deepseek": Shape("58x256+32", 58, 256, 32, (64, 65, 63)),
    "deepseek-hosts": Shape("58x256+32, 8/host", 58, 256, 32, (64, 65, 63), per_host=8),
    "covered": Shape("24x128+128", 24, 128, 128, (16, 17, 15)),
    "medium": Shape("24x128+16", 24, 128, 16, (16, 17, 15)),
    "small": Shape("4x16+4", 4, 16, 4, (4, 5, 3)),
}


def skewed_loads(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    profile = 1000.0 / np.arange(1, shape.experts + 1) ** 1.0
    return np.stack(
        [rng.permutation(profile) * rng.uniform(0.8, 1.2, shape.experts) for _ in range(shape.layers)]
    )


def python_fresh(loads: np.ndarray, redundant: int, world: int) -> np.ndarray:
    return np.array([rebalance(layer.tolist(), redundant, world) for layer in loads])


def domains_of(shape: Shape, world: int) -> list[str] | None:
    """Each rank's host: the engines of a host keep it across the steps (a retired rank's host stays)."""
    if shape.per_host == 1:
        return None
    return [f"host-{rank // shape.per_host}" for rank in range(world)]


def vllm_plan(loads: np.ndarray, shape: Shape, world: int, previous: np.ndarray | None) -> np.ndarray:
    """vLLM's policy for `world` ranks, as placement[layer, rank, slot]."""
    per_rank = slots_per_rank(shape.experts, shape.redundant, world)
    old = None
    if previous is not None and previous.shape[1] == world:
        old = torch.from_numpy(previous.reshape(previous.shape[0], -1))
    phy2log = DefaultEplbPolicy.rebalance_experts(torch.from_numpy(loads), world * per_rank, 1, 1, world, old)
    return phy2log.numpy().reshape(loads.shape[0], world, per_rank)


def timed(reps: int, plans: dict[str, Callable[[], Any]]) -> tuple[dict[str, Any], dict[str, float]]:
    """Each plan `reps` times, interleaved: (its result, its median wall time in ms)."""
    times: dict[str, list[float]] = {name: [] for name in plans}
    results: dict[str, Any] = {}
    for _ in range(reps):
        for name, plan in plans.items():
            start = time.perf_counter()
            results[name] = plan()
            times[name].append((time.perf_counter() - start) * 1000)
    return results, {name: statistics.median(t) for name, t in times.items()}


def figures(
    placement: np.ndarray, loads: np.ndarray, fresh_balance: np.ndarray, kept: np.ndarray, shape: Shape
) -> dict[str, Any]:
    world = placement.shape[1]
    coverage = coverage_of(placement, shape.experts, domains_of(shape, world))
    balance = layer_balance(placement, loads)
    return {
        "worst_balance_vs_fresh": round(float((balance / fresh_balance).min()), 4),
        "mean_balance": round(float(balance.mean()), 4),
        "copies": copies_moved(placement, kept),
        "pairs": int(held_pairs(placement, shape.experts).sum()),
        "at_risk": coverage.at_risk_engine,
        "at_risk_host": coverage.at_risk_domain,
        "covered": coverage.covered,
    }


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
    steps.append((f"{down} -> {down - 1}", down - 1, [r for r in range(down) if r != down // 2], loads))
    steps.append((f"{down - 1} -> {down - 1}, +-20% load", down - 1, None, noisy))

    ways = ("covered", "free", "vllm")
    first = {
        "covered": rebalance_layers(
            loads, shape.redundant, start, domains=domains_of(shape, start)
        ).placement,
        "free": rebalance_layers(loads, shape.redundant, start, coverage=False).placement,
        "vllm": vllm_plan(loads, shape, start, None),
    }
    current = dict(first)
    rows: list[list[object]] = []
    results = report.results.setdefault(shape.name, {"steps": []})
    for label, world, origin, step_loads in steps:
        domains = domains_of(shape, world)
        old_world = current["free"].shape[1]
        plans: dict[str, Callable[[], Any]] = {
            "covered": partial(
                rebalance_layers, step_loads, shape.redundant, world,
                previous=current["covered"], origin=origin, domains=domains,
            ),
            "free": partial(
                rebalance_layers, step_loads, shape.redundant, world,
                previous=current["free"], origin=origin, coverage=False,
            ),
            "vllm": partial(vllm_plan, step_loads, shape, world, current["vllm"]),
        }  # fmt: skip
        planned, ms = timed(reps, plans)
        fresh_balance = layer_balance(python_fresh(step_loads, shape.redundant, world), step_loads)
        per_way: dict[str, dict[str, Any]] = {}
        for way in ways:
            placement = planned[way] if way == "vllm" else planned[way].placement
            old = current[way]
            kept = origin_held(
                old, origin or [r if r < old.shape[1] else None for r in range(world)], shape.experts
            )
            per_way[way] = {
                **figures(placement, step_loads, fresh_balance, kept, shape),
                "plan_ms": round(ms[way], 2),
            }
            current[way] = placement
        per_rank = slots_per_rank(shape.experts, shape.redundant, world)
        bound = planned["free"].lower_bound
        covered, free, vllm = per_way["covered"], per_way["free"], per_way["vllm"]
        cost = covered["worst_balance_vs_fresh"] / free["worst_balance_vs_fresh"]
        copies_ratio = free["copies"] / bound if bound else (1.0 if free["copies"] == 0 else float("inf"))
        results["steps"].append(
            {
                "step": label,
                "world": world,
                "slots_per_rank": per_rank,
                "lower_bound": bound,
                "coverage_balance_vs_free": round(cost, 4),
                "free_copies_vs_bound": round(copies_ratio, 3),
                **{way: per_way[way] for way in ways},
            }
        )
        risk = " / ".join(
            f"{p['at_risk']}" + (f" ({p['at_risk_host']} host)" if p["at_risk_host"] is not None else "")
            for p in (covered, free, vllm)
        )
        rows.append(
            [
                shape.name,
                label,
                risk,
                f"{covered['worst_balance_vs_fresh']:.4f} / {free['worst_balance_vs_fresh']:.4f} / "
                f"{vllm['worst_balance_vs_fresh']:.4f}",
                f"{cost:.3f}",
                f"{covered['copies']} / {free['copies']} / {vllm['copies']}",
                f"{bound} ({copies_ratio:.2f})",
                f"{covered['plan_ms']:.1f} / {free['plan_ms']:.1f} / {vllm['plan_ms']:.1f}",
            ]
        )
        name = f"{shape.name} {label}"
        report.target(
            f"{name}: worst layer balance vs fresh (no coverage)",
            free["worst_balance_vs_fresh"],
            BALANCE_TARGET,
            "x",
            at_least=True,
        )
        if abs(world - old_world) == 1:  # the copies target is for one rank more or fewer
            report.target(f"{name}: copies vs lower bound (no coverage)", copies_ratio, COPIES_TARGET, "x")
        if shape.layers == 58:
            if shape.per_host == 1:
                report.target(
                    f"{name}: balance with coverage vs without",
                    cost,
                    COVERAGE_COST_TARGET,
                    "x",
                    at_least=True,
                )
            for way in ("covered", "free"):
                report.target(
                    f"{name}: plan time ({way}) vs vLLM's policy (median of {reps})",
                    per_way[way]["plan_ms"] / vllm["plan_ms"],
                    1.0,
                    "x",
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
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
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    rows: list[list[object]] = []
    for key in args.shapes:
        rows += run_shape(SHAPES[key], args.reps, report, args.seed)
    report.parameters["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report.add_table(
        "Placement per step: with coverage / without / vLLM's policy (each from its own previous placement)",
        [
            "shape",
            "step",
            "at risk (layer-expert pairs)",
            "worst balance vs fresh",
            "balance with / without coverage",
            "copies",
            "lower bound (copies without coverage / bound)",
            "plan ms, median",
        ],
        rows,
    )
    report.targets_table()
    report.notes.append(
        "At risk: layer-expert pairs held by one engine only (one engine loss would take them); with 8 "
        "engines per host, also those held on one host only. The DeepSeek-sized case has 288 replicas "
        "for 256 experts per layer (320 slots on 64 ranks): at most 64 experts per layer can have a second "
        "replica, and the skewed load wants most extra slots for the hot experts, so coverage stays "
        "partial there; the 24x128+128 case has room for two replicas of every expert."
    )
    report.notes.append(
        "With coverage the plan keeps >= 0.98 x 0.975 of the fresh balance (`COVERAGE_BALANCE`): the trades "
        "stop at that bound and coverage takes what is left, so its copies can be fewer than without."
    )
    report.notes.append(
        "Plan time (CPU time, 2-core machine, one plan each): without coverage the shrinks spend ~2/3 in the "
        "swap-down's trades (`engine_agent/layer_trades.py`): at 65 -> 63 the two ways a layer tries weigh "
        "~5,300 trades in ~240 rounds, each trade every (replica, partner rank, replica) of the layer's "
        "heaviest rank, 5 x 63 x 5 = 1,575 candidates: 8.4 M candidates, ~115 ms, ~14 ns a candidate "
        "(~140 us a round of fixed numpy calls, ~35 ms; the rest the ~11 array passes and the gathers "
        "per candidate, which grow with the layers still over target); the rest of the plan "
        "(keep, make room, fill, fresh placement) is ~55 ms. With coverage the trades are ~1/3 and the "
        "coverage passes ~1/4. vLLM's whole (copy-blind) plan is ~40-45 ms here. The trades "
        "bring down the ranks per layer that the fewest-copies placement leaves over the 0.98 balance "
        "target; fewer trades, or fewer candidates per trade, would be other plans (copies, balance), "
        "not the same plan faster: the same plans within vLLM's time would need the trade loop compiled "
        "(an estimate, not measured: 8.4 M candidates at ~2 ns is ~17 ms), not more numpy."
    )
    report.notes.append(
        "vLLM's policy plans every step fresh (its old placement only keeps slots within a rank when the "
        "size is unchanged), so it moves most pairs on every change."
    )
    report.write()


if __name__ == "__main__":
    main()
