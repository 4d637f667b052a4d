"""The moves behind `layer_placement.rebalance_layers`: a placement built from the previous one (keep,
make room, fill, swap down), each vectorised over layers. The fresh placement is `layer_fresh`, the
swap-down `layer_trades`.

Shapes as in `layer_placement`: `loads[layer, expert]`, `placement[layer, rank, slot]`,
`held[layer, rank, expert]` (the rank holds at least one replica of the expert).
"""

from __future__ import annotations

import numpy as np

from engine_agent.layer_cover import cover
from engine_agent.layer_coverage import per_unit_counts
from engine_agent.layer_fresh import BoolArray, FloatArray, IntArray, held_pairs, swap_in
from engine_agent.layer_trades import swap_down

__all__ = ["BoolArray", "FloatArray", "IntArray", "held_pairs", "incremental"]

# Where an extra replica goes, only this many of the heaviest ranks are weighed (the next bounds the rest).
PEAK_RANKS = 8


def _trim_ranks(kept: BoolArray, weights: FloatArray, per_rank: int) -> BoolArray:
    """kept, less each rank's lightest experts beyond its slots (only where a rank has too many)."""
    if kept.sum(axis=2).max(initial=0) <= per_rank:
        return kept.copy()
    order = np.argsort(-weights, axis=1, kind="stable")[:, None, :]
    by_weight = np.take_along_axis(kept, order, axis=2)
    by_weight &= np.cumsum(by_weight, axis=2, dtype=np.int32) <= per_rank
    out = np.zeros_like(kept)
    np.put_along_axis(out, np.broadcast_to(order, kept.shape), by_weight, axis=2)
    return out


def _keep(kept: BoolArray, counts: IntArray, weights: FloatArray, per_rank: int) -> BoolArray:
    """The old (rank, expert) pairs that may stay under fixed replica counts: no rank beyond its slots
    (its heaviest experts stay), no expert beyond its count (its least-loaded holders stay)."""
    keep = _trim_ranks(kept, weights, per_rank)
    over = (keep.sum(axis=1) > counts).any(axis=1)
    if not over.any():
        return keep
    idx = np.flatnonzero(over)
    sub = keep[idx]
    rank_load = (sub * weights[idx][:, None, :]).sum(axis=2)
    world = kept.shape[1]
    # Each rank's place in its layer's order, lightest first; then every held pair by (layer,
    # expert, that place): within an expert, a pair whose place exceeds the count goes.
    place = np.empty_like(rank_load, dtype=np.int64)
    np.put_along_axis(place, np.argsort(rank_load, axis=1, kind="stable"), np.arange(world)[None, :], axis=1)
    layer, rank, expert = np.nonzero(sub)
    order = np.lexsort((place[layer, rank], expert, layer))
    group = (layer * kept.shape[2] + expert)[order]
    nth = np.arange(group.size) - np.searchsorted(group, group)
    gone = order[nth >= counts[idx[layer[order]], expert[order]]]
    sub[layer[gone], rank[gone], expert[gone]] = False
    keep[idx] = sub
    return keep


def _layout(held: BoolArray, per_rank: int) -> IntArray:
    """placement[layer, rank, slot] of the pairs in held (at most per_rank per rank), -1 = free."""
    num_layers, world, _ = held.shape
    placement = np.full((num_layers, world, per_rank), -1, dtype=np.int64)
    layer, rank, expert = np.nonzero(held)
    group = layer * world + rank
    position = np.arange(group.size) - np.searchsorted(group, group)
    placement[layer, rank, position] = expert
    return placement


def _keep_all(kept: BoolArray, loads: FloatArray, per_rank: int) -> BoolArray:
    """Every old pair stays, except past a rank's slots (its lightest experts go)."""
    return _trim_ranks(kept, loads, per_rank)


def _make_room(held: BoolArray, loads: FloatArray, per_rank: int) -> None:
    """In place: while a layer has more experts nobody holds than free slots, put the heaviest such
    expert in place of a replica of an expert held more than once, choosing the (rank, replica) that
    leaves the heavier of that rank and the expert's other holders lightest. A layer with nothing held
    twice keeps its shortfall (the caller takes another way for it)."""
    world = held.shape[1]
    total = world * per_rank
    counts = held.sum(axis=1)
    # The held pairs (a few per rank, not every (rank, expert)), found once: a move changes one
    # pair's expert in place.
    all_lay, all_rank, all_expert = np.nonzero(held)
    where = np.full(held.shape[0], -1, dtype=np.int64)  # a layer's row among those still short
    for _ in range(total):
        short = (counts == 0).sum(axis=1) - (total - counts.sum(axis=1))
        layers = np.flatnonzero(short > 0)
        if layers.size == 0:
            return
        c, load = counts[layers], loads[layers]
        num, num_logical = layers.size, load.shape[1]
        per_replica = load / np.maximum(c, 1)
        where[:] = -1
        where[layers] = np.arange(num)
        mine = np.flatnonzero(where[all_lay] >= 0)
        lay, rank, expert = where[all_lay[mine]], all_rank[mine], all_expert[mine]
        weight = per_replica[lay, expert]
        rank_load = np.bincount(lay * world + rank, weights=weight, minlength=num * world).reshape(num, world)
        pair_load = rank_load[lay, rank]
        orphan = np.where(c == 0, load, -1.0).argmax(axis=1)
        incoming = load[np.arange(num), orphan]
        own = pair_load - weight + incoming[lay]
        # The other holders each gain a share of the dropped replica (the heaviest holder bounds them).
        holders_peak = np.full((num, num_logical), -np.inf)
        np.maximum.at(holders_peak, (lay, expert), pair_load)
        others = holders_peak[lay, expert] + load[lay, expert] / np.maximum(c[lay, expert] - 1, 1) - weight
        score = np.where(c[lay, expert] >= 2, np.maximum(own, others), np.inf)
        # Each layer's best: its first pair at its lowest score (the pairs are in layer order).
        start = np.searchsorted(lay, np.arange(num))
        present = start < np.append(start[1:], lay.size)
        lowest = np.full(num, np.inf)
        lowest[present] = np.minimum.reduceat(score, start[present])
        hit = np.flatnonzero(score == lowest[lay])
        hit = hit[np.r_[True, lay[hit[1:]] != lay[hit[:-1]]]] if hit.size else hit
        best = np.zeros(num, dtype=np.int64)
        best[lay[hit]] = hit
        found = present & np.isfinite(lowest)
        if not found.any():
            return
        at = layers[found]
        pick = best[found]
        gone, coming = expert[pick], orphan[found]
        held[at, rank[pick], gone] = False
        held[at, rank[pick], coming] = True
        counts[at, gone] -= 1
        counts[at, coming] += 1
        all_expert[mine[pick]] = coming


def _fill(held: BoolArray, loads: FloatArray, per_rank: int, unit: IntArray | None = None) -> IntArray:
    """In place on held: fill every free slot, experts nobody holds first (largest load first), then
    (with `unit`, where coverage is a goal) a second replica of the hottest expert whose replicas all
    sit in one unit, in another unit, then an extra replica of the expert whose replica relieves the
    heaviest rank most; each onto the least-loaded rank with room that lacks it. Returns the replica
    counts."""
    num_layers, world, _ = held.shape
    in_unit = per_unit_counts(held, unit, int(unit.max(initial=0)) + 1) if unit is not None else None
    span = (in_unit > 0).sum(axis=1) if in_unit is not None else None  # units holding each expert
    rows = np.arange(num_layers)
    counts = held.sum(axis=1)
    used = held.sum(axis=2)
    free = world * per_rank - counts.sum(axis=1)
    rank_load = (held * (loads / np.maximum(counts, 1))[:, None, :]).sum(axis=2)
    top = min(PEAK_RANKS, world)
    for _ in range(int(free.max(initial=0))):
        live = free > 0
        if not live.any():
            break
        # The rank that gets the replica: the least loaded with room (one that lacks the expert, below).
        rank = np.where(used < per_rank, rank_load, np.inf).argmin(axis=1)
        placeable = ~held[rows, rank]  # [layer, expert]
        orphan = np.where(counts == 0, loads, -1.0)
        # Otherwise the expert whose extra replica leaves the layer's heaviest rank lightest: its holders
        # shed load, the receiving rank gains one replica's share. Only the heaviest ranks can set the
        # peak: the next one bounds all the others.
        share = loads / (counts + 1)
        shed = loads / np.maximum(counts, 1) - share
        others = np.where(np.arange(world)[None, :] == rank[:, None], -np.inf, rank_load)
        after = _peak_after(held, others, shed, top)
        peak = np.maximum(after, rank_load[rows, rank][:, None] + share) - 1e-9 * share  # ties: hotter
        expert = np.where(placeable, peak, np.inf).argmin(axis=1)
        if in_unit is not None and unit is not None and span is not None:
            lone = (span == 1) & (in_unit[rows, unit[rank]] == 0)
            alone = np.where(lone & placeable, loads, -1.0)
            expert = np.where(alone.max(axis=1) >= 0, alone.argmax(axis=1), expert)
        expert = np.where(orphan.max(axis=1) >= 0, orphan.argmax(axis=1), expert)
        live &= placeable[rows, expert]  # else the slot stays free and the layer takes another way
        at, r, e = rows[live], rank[live], expert[live]
        if in_unit is not None and unit is not None and span is not None:
            span[at, e] += in_unit[at, unit[r], e] == 0
            in_unit[at, unit[r], e] += 1
        holders = held[at, :, e]  # [A, W] before the new replica
        rank_load[at] -= holders * np.where(counts[at, e] > 0, shed[at, e], 0.0)[:, None]
        rank_load[at, r] += share[at, e]
        held[at, r, e] = True
        counts[at, e] += 1
        used[at, r] += 1
        free[at] -= 1
    return counts


def _peak_after(held: BoolArray, others: FloatArray, shed: FloatArray, top: int) -> FloatArray:
    """[layer, expert]: the heaviest of the `top` heaviest ranks (by `others`) once every holder of the
    expert sheds `shed` of it, bounded below by the next rank. Only the experts of the heaviest rank
    change it: for any other, the heaviest rank stays; for one of those, it is the heaviest rank less
    the shed, or the first of the top ranks that lacks the expert."""
    num_layers, world = others.shape
    order = np.argsort(-others, axis=1, kind="stable")
    values = np.take_along_axis(others, order, axis=1)
    after = np.repeat(values[:, :1], held.shape[2], axis=1)
    layer, expert = np.nonzero(held[np.arange(num_layers), order[:, 0]])
    if layer.size:
        holds = held[layer[:, None], order[layer, :top], expert[:, None]]  # [pair, top rank]
        first = np.where(holds.all(axis=1), top, holds.argmin(axis=1))
        lacking = np.where(first < top, values[layer, np.minimum(first, top - 1)], -np.inf)
        after[layer, expert] = np.maximum(values[layer, 0] - shed[layer, expert], lacking)
    if world > top:
        after = np.maximum(after, values[:, top : top + 1])
    return after


def incremental(
    loads: FloatArray,
    world: int,
    per_rank: int,
    kept: BoolArray,
    target: FloatArray,
    counts: IntArray | None = None,
    unit: IntArray | None = None,
) -> tuple[IntArray, IntArray, BoolArray]:
    """Keep what may stay, fill the free slots, then swap replicas between the most loaded rank and any
    other (fewest added copies first) until every layer is under `target`.

    Without `counts`, every old pair that fits stays; experts nobody holds take free slots (or the
    place of a replica held twice), then extra replicas that relieve the heaviest rank most fill the
    rest: the replica counts follow. With `counts` (the fresh ones), pairs stay up to those counts
    and the missing replicas fill the slots that frees. Returns (placement, counts, layers not under
    target); a layer whose slots cannot all be filled counts as not under target.

    With `unit` (each rank's failure unit), coverage is a goal: conversions that cover experts run
    before the trades (a heavy rank giving up a replica of an expert held widely is relieved for one
    copy) and after them (trades can bring two replicas into one unit), all within `target`.
    """
    if counts is None:
        held = _keep_all(kept, loads, per_rank)
        _make_room(held, loads, per_rank)
        counts = _fill(held, loads, per_rank, unit)
        placement = _layout(held, per_rank)
    else:
        held = _keep(kept, counts, loads / counts, per_rank)
        placement = _layout(held, per_rank)
        _place_missing(placement, held, loads, counts, per_rank, unit)
    unfit = (placement < 0).any(axis=(1, 2))
    fit = np.flatnonzero(~unfit)
    if unit is not None and fit.size:
        placement[fit] = cover(placement[fit], loads[fit], kept[fit], target[fit], unit)
        held[fit] = held_pairs(placement[fit], loads.shape[1])
        counts = held.sum(axis=1)
    weights = loads / np.maximum(counts, 1)
    rank_load = (held * weights[:, None, :]).sum(axis=2)
    target = np.where(unfit, np.inf, target)  # nothing to swap where slots are empty
    unfit |= swap_down(placement, rank_load, held, kept, weights, target)
    fit = np.flatnonzero(~unfit)
    if unit is not None and fit.size:
        placement[fit] = cover(placement[fit], loads[fit], kept[fit], target[fit], unit)
        counts[fit] = held_pairs(placement[fit], loads.shape[1]).sum(axis=1)
    return np.sort(placement, axis=2), counts, unfit


def _place_missing(
    placement: IntArray,
    held: BoolArray,
    loads: FloatArray,
    counts: IntArray,
    per_rank: int,
    unit: IntArray | None = None,
) -> None:
    """In place: the replicas `counts` asks for beyond those held, largest first, each onto the
    least-loaded rank with room that lacks it (with `unit`: outside the unit that holds all of the
    expert's replicas, where such a rank has room)."""
    in_unit = per_unit_counts(held, unit, int(unit.max(initial=0)) + 1) if unit is not None else None
    num_layers = held.shape[0]
    weights = loads / counts
    used = held.sum(axis=2)
    rank_load = (held * weights[:, None, :]).sum(axis=2)
    missing = counts - held.sum(axis=1)
    todo = int(missing.sum(axis=1).max(initial=0))
    if not todo:
        return
    order = np.argsort(-np.where(missing > 0, weights, -1.0), axis=1, kind="stable")
    reps = np.full((num_layers, todo), -1, dtype=np.int64)
    for layer in range(num_layers):
        items = np.repeat(order[layer], np.take_along_axis(missing, order, axis=1)[layer])
        reps[layer, : items.size] = items
    rows = np.arange(num_layers)
    for i in range(todo):
        live = reps[:, i] >= 0
        expert = np.where(live, reps[:, i], 0)
        ok = (used < per_rank) & ~held[rows, :, expert]
        if in_unit is not None and unit is not None:
            here = in_unit[rows, :, expert] > 0  # [layer, unit]
            lone = here.sum(axis=1) == 1
            away = ok & ~here[rows[:, None], unit[None, :]]
            ok = np.where((lone & away.any(axis=1))[:, None], away, ok)
        stuck = live & ~ok.any(axis=1)
        for layer in np.flatnonzero(stuck).tolist():
            swap_in(
                placement[layer],
                used[layer],
                held[layer],
                rank_load[layer],
                weights[layer],
                int(expert[layer]),
            )
        live &= ~stuck
        rank = np.where(ok, rank_load, np.inf).argmin(axis=1)
        at, r, e = rows[live], rank[live], expert[live]
        placement[at, r, used[at, r]] = e
        used[at, r] += 1
        rank_load[at, r] += weights[at, e]
        held[at, r, e] = True
        if in_unit is not None and unit is not None:
            in_unit[at, unit[r], e] += 1
