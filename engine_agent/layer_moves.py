"""The moves behind `layer_placement.rebalance_layers`: a placement built from the previous one (keep,
make room, fill, swap down), each vectorised over layers. The fresh placement is `layer_fresh`.

Shapes as in `layer_placement`: `loads[layer, expert]`, `placement[layer, rank, slot]`,
`held[layer, rank, expert]` (the rank holds at least one replica of the expert).
"""

from __future__ import annotations

import numpy as np

from engine_agent.layer_cover import cover
from engine_agent.layer_coverage import per_unit_counts
from engine_agent.layer_fresh import BoolArray, FloatArray, IntArray, held_pairs, swap_in

__all__ = ["BoolArray", "FloatArray", "IntArray", "held_pairs", "incremental"]

# Added to the score of a trade that does not lower the peak: beyond any valid score (copies count
# a few times the heavy rank's load), finite so that 0 x it stays 0.
_INVALID = 1e300
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
    lightest = np.argsort(rank_load, axis=1, kind="stable")[:, :, None]
    by_load = np.take_along_axis(sub, lightest, axis=1)
    by_load &= np.cumsum(by_load, axis=1, dtype=np.int32) <= counts[idx][:, None, :]
    trimmed = np.zeros_like(sub)
    np.put_along_axis(trimmed, np.broadcast_to(lightest, sub.shape), by_load, axis=1)
    keep[idx] = trimmed
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
        order = np.lexsort((score, lay))  # by layer, then score: each layer's best comes first
        first = np.searchsorted(lay[order], np.arange(num))
        present = first < lay.size
        best = order[np.minimum(first, lay.size - 1)]
        found = present & (lay[best] == np.arange(num)) & np.isfinite(score[best])
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
    unfit |= _swap_down(placement, rank_load, held, kept, weights, target)
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


def _swap_down(
    placement: IntArray,
    rank_load: FloatArray,
    held: BoolArray,
    kept: BoolArray,
    weights: FloatArray,
    target: FloatArray,
) -> BoolArray:
    """In place: while a layer's heaviest rank is over target, trade one of its replicas for a lighter
    one of another rank, choosing the trade that adds the fewest copies, then the lowest new maximum.

    Every (replica a of the heavy rank, rank r, replica b of r) is weighed at once; the score is
    copies(a -> r) + copies(b -> heavy), each a [a, r] or [r, b] table (inf where the receiver holds it
    already), plus the new maximum. The tables read `held` and `kept` by (expert, rank) rows, kept in
    that order here, and the four-dimensional scores reuse two buffers (fresh large temporaries cost
    more than the arithmetic)."""
    num_layers, world, per_rank = placement.shape
    stalled = np.zeros(num_layers, dtype=bool)
    held_t = np.ascontiguousarray(held.transpose(0, 2, 1))  # [layer, expert, rank]
    kept_t = np.ascontiguousarray(kept.transpose(0, 2, 1))
    # Whether each slot's replica was there before (a trade that moves a copy away saves one).
    kept_slot = kept[np.arange(num_layers)[:, None, None], np.arange(world)[None, :, None], placement]
    scores = np.empty((num_layers, per_rank, world * per_rank))
    peaks = np.empty_like(scores)
    invalid = np.empty(scores.shape, dtype=bool)
    for _ in range(4 * world * per_rank):
        active = np.flatnonzero((rank_load.max(axis=1) > target) & ~stalled)
        if active.size == 0:
            break
        size = active.size
        row = np.arange(size)
        loads_now = rank_load[active]
        heavy = loads_now.argmax(axis=1)
        top = loads_now[row, heavy]
        per_copy = (top * 4 + 1)[:, None, None]  # one copy outweighs any difference of peaks
        mine = placement[active, heavy]  # [A, S]
        theirs = placement[active].reshape(size, -1)  # [A, W * S]
        weight = weights[active]
        w_mine = weight[row[:, None], mine]
        w_theirs = weight[row[:, None], theirs]  # [A, W * S]
        # a -> r: a copy unless r kept a; one saved if a was a copy on the heavy rank.
        to_r = (~kept_t[active[:, None], mine]).astype(np.float64) - (~kept_slot[active, heavy])[:, :, None]
        to_r *= per_copy
        np.copyto(to_r, np.inf, where=held_t[active[:, None], mine])  # [A, S, W]
        # b -> heavy: a copy unless the heavy rank kept b; one saved if b was a copy on r.
        heavy_kept = kept[active[:, None], heavy[:, None], theirs]
        to_h = (~heavy_kept).astype(np.float64) - ~kept_slot[active].reshape(size, -1)
        to_h *= per_copy[:, :, 0]
        np.copyto(to_h, np.inf, where=held[active[:, None], heavy[:, None], theirs])  # [A, W * S]
        # [A, S, W * S] (a, then r and b): the long last axis keeps numpy's inner loops long.
        delta = np.subtract(w_mine[:, :, None], w_theirs[:, None, :], out=scores[:size])
        peak = np.add(np.repeat(loads_now, per_rank, axis=1)[:, None, :], delta, out=peaks[:size])  # r after
        top3 = top[:, None, None]
        np.subtract(top3, delta, out=delta)  # the heavy rank after the trade
        np.maximum(delta, peak, out=peak)
        # A trade must lower the heavy rank and leave r below where the heavy rank was: the others get
        # _INVALID added (a multiply and an add cost far less than a masked assignment).
        np.greater_equal(peak, top3, out=invalid[:size])
        score = np.add(np.repeat(to_r, per_rank, axis=2), to_h[:, None, :], out=scores[:size])
        score += peak
        score += np.multiply(invalid[:size], _INVALID, out=peaks[:size])
        flat = score.reshape(size, -1)
        best = flat.argmin(axis=1)
        found = flat[row, best] < _INVALID / 2
        stalled[active[~found]] = True
        a, r, b = np.unravel_index(best[found], (per_rank, world, per_rank))
        lay = active[found]
        h = heavy[found]
        ea = placement[lay, h, a]
        eb = placement[lay, r, b]
        placement[lay, h, a] = eb
        placement[lay, r, b] = ea
        for pairs, rank_of, expert_of in ((held, 1, 2), (held_t, 2, 1)):
            index: list[IntArray] = [lay, lay, lay]
            for gone_rank, gone, stays in ((h, ea, False), (r, eb, False), (h, eb, True), (r, ea, True)):
                index[rank_of], index[expert_of] = gone_rank, gone
                pairs[tuple(index)] = stays
        kept_slot[lay, h, a] = kept[lay, h, eb]
        kept_slot[lay, r, b] = kept[lay, r, ea]
        d = weights[lay, ea] - weights[lay, eb]
        rank_load[lay, h] -= d
        rank_load[lay, r] += d
    return rank_load.max(axis=1) > target
