"""Per-layer expert placement, planned from the previous one so that few weight copies move.

numpy, no torch: the coordinator imports it. Arrays, not lists, because a DeepSeek-V3-like model has
58 MoE layers x 256 experts x 64 ranks and a plan must take tens of milliseconds: every step below
runs over all layers at once, looping only over the replicas of one layer.

Shapes: `loads[layer, expert]`, `placement[layer, rank, slot] = logical expert`. Every layer has the
same number of ranks and slots (`slots_per_rank`). A "copy" is one (layer, rank, expert) that the rank
must hold in the new placement and did not hold in the old one: one expert's weights over the network.

The plan (`rebalance_layers`):
1. Replica counts per layer: one replica per expert, then each extra slot to the expert with the highest
   load per replica (the same rule as `placement.rebalance`).
2. A fresh placement (largest replica first onto the least-loaded rank with room): the balance to keep
   (`layer_fresh`).
3. From the previous placement (`layer_moves.incremental`), two ways per layer: every old pair that fits
   stays (the replica counts follow), or pairs stay up to the fresh replica counts; then trades until
   the heaviest rank is within `min_balance` of the fresh maximum. Each layer takes the cheaper way
   that reaches it, else the fresh placement with its ranks matched to the old ranks by overlap.
4. Coverage (`layer_coverage.cover`): replicas of experts that stay covered without them give their
   slot to second replicas of uncovered experts in another failure domain, one copy each, as long as
   every rank stays within `min_balance x coverage_balance` of the fresh maximum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine_agent.layer_cover import cover
from engine_agent.layer_coverage import Coverage, coverage_of, per_unit_counts, uncovered, units_of
from engine_agent.layer_fresh import (
    BoolArray,
    FloatArray,
    IntArray,
    fresh_placement,
    held_pairs,
    replica_counts,
)
from engine_agent.layer_moves import incremental
from engine_agent.placement import slots_per_rank

# What coverage may cost: the covered plan keeps at least this x the balance the plan allows without
# it (the bound is 0.97 of the coverage-free plan; the margin keeps rounding on its side).
COVERAGE_BALANCE = 0.975
# Aim just inside the allowed balance, so that rounding never lands a layer on the wrong side of it.
_CAP_MARGIN = 0.999
# A layer whose copies (keeping every old pair) exceed this x its lower bound also tries the fresh
# replica counts, and takes the cheaper of the two.
_RETRY_ABOVE_BOUND = 1.5


def normalized_loads(expert_load: npt.ArrayLike, num_logical: int | None = None) -> FloatArray:
    """loads[layer, expert] as float64; a 1-D load is one layer; a layer with no load is uniform."""
    loads = np.array(expert_load, dtype=np.float64)
    if loads.ndim == 1:
        loads = loads[None, :]
    if loads.ndim != 2:
        raise ValueError(f"expert_load must be [layers, experts], got shape {loads.shape}")
    if loads.shape[1] == 0:
        if num_logical is None:
            raise ValueError("expert_load is empty and num_logical is not given: no experts to place")
        loads = np.zeros((loads.shape[0], num_logical))
    if num_logical is not None and loads.shape[1] != num_logical:
        raise ValueError(
            f"expert_load has {loads.shape[1]} experts per layer but num_logical is {num_logical}"
        )
    if loads.shape[0] == 0:
        raise ValueError("expert_load has no layers")
    bad = ~np.isfinite(loads) | (loads < 0)
    if bad.any():
        layer, expert = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"layer {layer} expert {expert} has an invalid load {loads[layer, expert]!r}")
    idle = loads.sum(axis=1) == 0
    loads[idle] = 1.0
    return loads


def layer_rank_loads(placement: IntArray, loads: FloatArray) -> FloatArray:
    """[layer, rank] load, each expert's load split evenly over its replicas in that layer."""
    num_layers, num_logical = loads.shape
    flat = (placement + (np.arange(num_layers) * num_logical)[:, None, None]).ravel()
    counts = np.bincount(flat, minlength=num_layers * num_logical).reshape(num_layers, num_logical)
    per_replica = loads / np.maximum(counts, 1)
    return (
        np.take_along_axis(per_replica, placement.reshape(num_layers, -1), axis=1)
        .reshape(placement.shape)
        .sum(axis=2)
    )


def layer_balance(placement: IntArray, loads: FloatArray) -> FloatArray:
    """mean / max rank load per layer: 1.0 is perfect; higher is better."""
    rank_load = layer_rank_loads(placement, loads)
    peak = rank_load.max(axis=1)
    return np.where(peak > 0, rank_load.mean(axis=1) / np.where(peak > 0, peak, 1.0), 1.0)


def _match_by_overlap(fresh: IntArray, kept: BoolArray) -> IntArray:
    """Reorder the ranks of one layer's fresh placement so that each new rank gets the fresh rank
    that shares the most experts with what it holds (greedy, the largest overlap first)."""
    world = fresh.shape[0]
    fresh_held = held_pairs(fresh[None], kept.shape[1])[0]
    overlap = (kept.astype(np.int64) @ fresh_held.T.astype(np.int64)).astype(np.float64)  # [new, fresh]
    assigned = np.zeros(world, dtype=np.int64)
    for _ in range(world):
        target, source = np.unravel_index(int(overlap.argmax()), overlap.shape)
        assigned[target] = source
        overlap[target, :] = -1
        overlap[:, source] = -1
    return fresh[assigned]


def origin_held(previous: IntArray, origin: Sequence[int | None], num_logical: int) -> BoolArray:
    """held[layer, new rank, expert] before the change: what each new rank's engine already holds."""
    old_held = held_pairs(previous, num_logical)
    kept = np.zeros((previous.shape[0], len(origin), num_logical), dtype=bool)
    for new_rank, old_rank in enumerate(origin):
        if old_rank is not None:
            if not 0 <= old_rank < previous.shape[1]:
                raise ValueError(
                    f"new rank {new_rank} comes from old rank {old_rank}, not in the old placement"
                )
            kept[:, new_rank] = old_held[:, old_rank]
    return kept


def copies_moved(placement: IntArray, kept: BoolArray) -> int:
    """(layer, rank, expert) the new placement needs that the rank did not hold before."""
    return int((held_pairs(placement, kept.shape[2]) & ~kept).sum())


def _lower_bounds(counts: IntArray, kept: BoolArray, per_rank: int) -> IntArray:
    """Per layer, the fewest copies any placement with these replica counts needs: an expert needs a
    copy for each replica beyond the new ranks that already hold it; a rank for each slot beyond the
    experts it already holds (each is a bound; the larger one counts)."""
    world = kept.shape[1]
    num_logical = kept.shape[2]
    by_expert = np.maximum(np.minimum(counts, world) - kept.sum(axis=1), 0).sum(axis=1)
    by_rank = np.maximum(min(per_rank, num_logical) - kept.sum(axis=2), 0).sum(axis=1)
    return np.maximum(by_expert, by_rank)


def copies_lower_bound(counts: IntArray, kept: BoolArray, per_rank: int) -> int:
    """`_lower_bounds` summed over layers."""
    return int(_lower_bounds(counts, kept, per_rank).sum())


@dataclass(frozen=True)
class LayerPlan:
    """A per-layer placement and what it costs to get there."""

    placement: IntArray  # [layer, rank, slot]
    copies_moved: int
    lower_bound: int  # for the plan's replica counts (see copies_lower_bound)
    balance: FloatArray  # [layer], mean / max rank load
    fresh_balance: FloatArray  # [layer], the same for a fresh placement
    fallback_layers: int  # layers that took the overlap-matched fresh placement
    coverage: Coverage | None = None  # of the new placement, with the domains it was planned for

    def to_lists(self) -> list[list[list[int]]]:
        return [[[int(e) for e in slots] for slots in layer] for layer in self.placement]


def rebalance_layers(
    expert_load: npt.ArrayLike,
    num_redundant: int,
    world_size: int,
    *,
    previous: npt.ArrayLike | None = None,
    origin: Sequence[int | None] | None = None,
    num_logical: int | None = None,
    min_balance: float = 0.98,
    domains: Sequence[str] | None = None,
    coverage: bool = True,
    coverage_balance: float = COVERAGE_BALANCE,
) -> LayerPlan:
    """Plan every layer for `world_size` ranks, starting from `previous[layer, old rank, slot]`.

    `origin[new rank]` is the old rank the same engine had (None: a joiner); by default new rank i was
    old rank i where one existed. Without `previous` every copy moves (everything loads from the
    checkpoint). `domains[new rank]`: its failure domain (None: each engine its own). With `coverage`,
    the plan covers what it can within `coverage_balance` of the balance it would have without.
    Deterministic for the same inputs.
    """
    loads = normalized_loads(expert_load, num_logical)
    num_layers, experts = loads.shape
    per_rank = slots_per_rank(experts, num_redundant, world_size)
    counts = replica_counts(loads, world_size * per_rank, world_size)
    fresh = fresh_placement(loads, counts, world_size, per_rank)
    fresh_balance = layer_balance(fresh, loads)
    unit, _ = units_of(domains, world_size)
    # max rank load <= fresh max / min_balance  <=>  balance >= min_balance x fresh (same mean).
    fresh_peak = layer_rank_loads(fresh, loads).max(axis=1)
    covered_cap = fresh_peak / (min_balance * coverage_balance) * _CAP_MARGIN
    # Where the slots hold two replicas of every expert: two each, then the rest as usual, placed
    # with second replicas in other units; a layer takes it where it keeps within the balance.
    two_each: IntArray | None = None
    start = fresh
    if coverage and world_size >= 2 and world_size * per_rank >= 2 * experts:
        two_each = replica_counts(loads, world_size * per_rank, world_size, floor=2)
        covering = fresh_placement(loads, two_each, world_size, per_rank, unit)
        fits = layer_rank_loads(covering, loads).max(axis=1) <= covered_cap
        start = np.where(fits[:, None, None], covering, fresh)
    if previous is None:
        kept = np.zeros((num_layers, world_size, experts), dtype=bool)
        if coverage:
            start = np.sort(cover(start.copy(), loads, kept, covered_cap, unit), axis=2)
        plan = LayerPlan(start, 0, 0, layer_balance(start, loads), fresh_balance, 0)
        return _finish(plan, counts, kept, per_rank, domains)

    old = np.asarray(previous, dtype=np.int64)
    if old.ndim != 3 or old.shape[0] != num_layers:
        raise ValueError(f"previous placement must be [{num_layers} layers, ranks, slots], got {old.shape}")
    if old.size and (old.min() < 0 or old.max() >= experts):
        raise ValueError(f"previous placement holds ids outside [0, {experts})")
    if origin is None:
        origin = [r if r < old.shape[1] else None for r in range(world_size)]
    if len(origin) != world_size:
        raise ValueError(f"origin has {len(origin)} entries for {world_size} ranks")
    kept = origin_held(old, origin, experts)

    # With coverage, one bound for everything: the trades stop at it and coverage takes what is left.
    target = covered_cap if coverage else fresh_peak / min_balance * _CAP_MARGIN
    cover_unit = unit if coverage else None
    # Two ways per layer: every old pair that fits stays (the replica counts follow), or pairs stay up
    # to the fresh replica counts (two each where coverage fits the slots). Each layer takes the
    # cheaper way that reaches the balance, else the fresh placement matched to the old ranks.
    # The second way runs only where the first missed, moved more than the bound allows for, or (two
    # each) left an expert uncovered.
    placement, _, unfit = incremental(loads, world_size, per_rank, kept, target, unit=cover_unit)
    copies = np.where(unfit, np.inf, (held_pairs(placement, experts) & ~kept).sum(axis=(1, 2)))
    bound = _lower_bounds(counts, kept, per_rank)
    again_counts = counts if two_each is None else two_each
    if coverage:  # the copies that covered experts do not count against the bound
        before = (per_unit_counts(kept, unit, int(unit.max()) + 1) > 0).sum(axis=1) < 2
        copies = copies - np.maximum(before.sum(axis=1) - uncovered(placement, experts, unit), 0)
    short = copies > bound * _RETRY_ABOVE_BOUND
    if two_each is not None:
        short |= uncovered(placement, experts, unit) > 0
    retry = np.flatnonzero(short)
    if retry.size:
        again, _, missed = incremental(
            loads[retry], world_size, per_rank, kept[retry], target[retry], again_counts[retry], cover_unit
        )
        # Copies, and with coverage each expert left uncovered as one more (covering it takes one).
        cost = np.where(unfit[retry], np.inf, _cost(placement[retry], kept[retry], cover_unit))
        again_cost = np.where(missed, np.inf, _cost(again, kept[retry], cover_unit))
        better = again_cost < cost
        placement[retry[better]] = again[better]
        unfit[retry] &= missed
    for layer in np.flatnonzero(unfit):
        placement[layer] = _match_by_overlap(start[layer], kept[layer])
    if coverage and unfit.any():
        matched = np.flatnonzero(unfit)
        covered = cover(placement[matched], loads[matched], kept[matched], covered_cap[matched], unit)
        placement[matched] = np.sort(covered, axis=2)
    balance = layer_balance(placement, loads)
    plan = LayerPlan(placement, 0, int(bound.sum()), balance, fresh_balance, int(unfit.sum()))
    return _finish(plan, counts, kept, per_rank, domains)


def _cost(placement: IntArray, kept: BoolArray, unit: IntArray | None) -> FloatArray:
    """[layer]: copies, plus uncovered experts where coverage is a goal."""
    copies = (held_pairs(placement, kept.shape[2]) & ~kept).sum(axis=(1, 2))
    if unit is None:
        return copies.astype(np.float64)
    return (copies + uncovered(placement, kept.shape[2], unit)).astype(np.float64)


def _finish(
    plan: LayerPlan, counts: IntArray, kept: BoolArray, per_rank: int, domains: Sequence[str] | None
) -> LayerPlan:
    """The plan with its copies, lower bound (unless computed already) and coverage."""
    return LayerPlan(
        placement=plan.placement,
        copies_moved=copies_moved(plan.placement, kept),
        lower_bound=plan.lower_bound or copies_lower_bound(counts, kept, per_rank),
        balance=plan.balance,
        fresh_balance=plan.fresh_balance,
        fallback_layers=plan.fallback_layers,
        coverage=coverage_of(plan.placement, kept.shape[2], domains),
    )
