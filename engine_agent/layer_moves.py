"""The moves behind `layer_placement.rebalance_layers`: a fresh placement, and a placement built from
the previous one (keep, make room, fill, swap down), each vectorised over layers.

Shapes as in `layer_placement`: `loads[layer, expert]`, `placement[layer, rank, slot]`,
`held[layer, rank, expert]` (the rank holds at least one replica of the expert).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# Where an extra replica goes, only this many of the heaviest ranks are weighed (the next bounds the rest).
PEAK_RANKS = 8


def held_pairs(placement: IntArray, num_logical: int) -> BoolArray:
    """held[layer, rank, expert]: the rank holds at least one replica of the expert."""
    num_layers, world, _ = placement.shape
    held = np.zeros((num_layers, world, num_logical), dtype=bool)
    layer = np.arange(num_layers)[:, None, None]
    rank = np.arange(world)[None, :, None]
    held[layer, rank, placement] = True
    return held


def _sorted_replicas(loads: FloatArray, counts: IntArray, total: int) -> tuple[IntArray, FloatArray]:
    """Every layer's replicas, largest load per replica first: (experts [layer, i], weights)."""
    num_layers, num_logical = loads.shape
    per_replica = loads / counts
    experts = np.repeat(np.tile(np.arange(num_logical), num_layers), counts.ravel()).reshape(
        num_layers, total
    )
    weights = np.take_along_axis(per_replica, experts, axis=1)
    order = np.argsort(-weights, axis=1, kind="stable")
    return np.take_along_axis(experts, order, axis=1), np.take_along_axis(weights, order, axis=1)


def fresh_placement(loads: FloatArray, counts: IntArray, world: int, per_rank: int) -> IntArray:
    """Largest replica first onto the least-loaded rank with room that lacks the expert (doubling up
    only when every rank with room holds it): the rule of `placement.rebalance`, over all layers."""
    num_layers = loads.shape[0]
    total = world * per_rank
    experts, weights = _sorted_replicas(loads, counts, total)
    per_replica = loads / counts
    rows = np.arange(num_layers)
    rank_load = np.zeros((num_layers, world))
    used = np.zeros((num_layers, world), dtype=np.int64)
    held = np.zeros((num_layers, world, loads.shape[1]), dtype=bool)
    placement = np.empty((num_layers, world, per_rank), dtype=np.int64)
    for i in range(total):
        expert = experts[:, i]
        key = np.where((used < per_rank) & ~held[rows, :, expert], rank_load, np.inf)
        stuck = np.isinf(key.min(axis=1))
        for layer in np.flatnonzero(stuck):  # rare: only near the end, with few ranks
            _swap_in(
                placement[layer],
                used[layer],
                held[layer],
                rank_load[layer],
                per_replica[layer],
                int(expert[layer]),
            )
        at = rows[~stuck]
        target = key[at].argmin(axis=1)
        placement[at, target, used[at, target]] = expert[at]
        used[at, target] += 1
        rank_load[at, target] += weights[at, i]
        held[at, target, expert[at]] = True
    return np.sort(placement, axis=2)


def _swap_in(
    placement: IntArray,
    used: IntArray,
    held: BoolArray,
    rank_load: FloatArray,
    weights: FloatArray,
    expert: int,
) -> None:
    """One layer, in place: every rank with room already holds `expert`. Move another expert from a
    full rank that lacks `expert` into a free slot, and put `expert` in its place: the move that leaves
    the heavier of the two ranks lightest (as `placement.rebalance` does). Where no such move exists,
    `expert` doubles up on the least-loaded rank with room."""
    per_rank = placement.shape[1]
    best: tuple[float, int, int, int] | None = None
    for free in np.flatnonzero(used < per_rank).tolist():
        for full in np.flatnonzero((used >= per_rank) & ~held[:, expert]).tolist():
            for slot in range(per_rank):
                moved = int(placement[full, slot])
                if held[free, moved]:
                    continue
                after = max(
                    rank_load[free] + weights[moved], rank_load[full] - weights[moved] + weights[expert]
                )
                key = (float(after), free, full, slot)
                if best is None or key < best:
                    best = key
    if best is None:
        lightest = int(np.where(used < per_rank, rank_load, np.inf).argmin())
        placement[lightest, used[lightest]] = expert
        used[lightest] += 1
        rank_load[lightest] += weights[expert]
        return
    _, free, full, slot = best
    moved = int(placement[full, slot])
    placement[free, used[free]] = moved
    used[free] += 1
    placement[full, slot] = expert
    held[free, moved] = held[full, expert] = True
    held[full, moved] = False
    rank_load[free] += weights[moved]
    rank_load[full] += weights[expert] - weights[moved]


def _trim_ranks(kept: BoolArray, weights: FloatArray, per_rank: int) -> BoolArray:
    """kept, less each rank's lightest experts beyond its slots (only where a rank has too many)."""
    if kept.sum(axis=2).max(initial=0) <= per_rank:
        return kept.copy()
    order = np.argsort(-weights, axis=1, kind="stable")[:, None, :]
    by_weight = np.take_along_axis(kept, order, axis=2)
    by_weight &= np.cumsum(by_weight, axis=2) <= per_rank
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
    by_load &= np.cumsum(by_load, axis=1) <= counts[idx][:, None, :]
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
    for _ in range(total):
        counts = held.sum(axis=1)
        short = (counts == 0).sum(axis=1) - (total - counts.sum(axis=1))
        layers = np.flatnonzero(short > 0)
        if layers.size == 0:
            return
        h, c, load = held[layers], counts[layers], loads[layers]
        num, num_logical = layers.size, load.shape[1]
        per_replica = load / np.maximum(c, 1)
        # Over the held pairs only (a few per rank), not every (rank, expert).
        lay, rank, expert = np.nonzero(h)
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
        held[at, rank[pick], expert[pick]] = False
        held[at, rank[pick], orphan[found]] = True


def _fill(held: BoolArray, loads: FloatArray, per_rank: int) -> IntArray:
    """In place on held: fill every free slot, experts nobody holds first (largest load first), then
    an extra replica of the expert with the highest load per replica; each onto the least-loaded rank
    with room that lacks it. Returns the replica counts."""
    num_layers, world, _ = held.shape
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
        order = np.argsort(-others, axis=1, kind="stable")
        heaviest = order[:, :top]
        after = (
            np.take_along_axis(others, heaviest, axis=1)[:, :, None]
            - held[rows[:, None], heaviest] * shed[:, None, :]
        ).max(axis=1)  # [layer, expert]
        if world > top:
            after = np.maximum(after, np.take_along_axis(others, order[:, top : top + 1], axis=1))
        peak = np.maximum(after, rank_load[rows, rank][:, None] + share) - 1e-9 * share  # ties: hotter
        expert = np.where(
            orphan.max(axis=1) >= 0, orphan.argmax(axis=1), np.where(placeable, peak, np.inf).argmin(axis=1)
        )
        live &= placeable[rows, expert]  # else the slot stays free and the layer takes another way
        at, r, e = rows[live], rank[live], expert[live]
        holders = held[at, :, e]  # [A, W] before the new replica
        rank_load[at] -= holders * np.where(counts[at, e] > 0, shed[at, e], 0.0)[:, None]
        rank_load[at, r] += share[at, e]
        held[at, r, e] = True
        counts[at, e] += 1
        used[at, r] += 1
        free[at] -= 1
    return counts


def incremental(
    loads: FloatArray,
    world: int,
    per_rank: int,
    kept: BoolArray,
    target: FloatArray,
    counts: IntArray | None = None,
) -> tuple[IntArray, IntArray, BoolArray]:
    """Keep what may stay, fill the free slots, then swap replicas between the most loaded rank and any
    other (fewest added copies first) until every layer is under `target`.

    Without `counts`, every old pair that fits stays; experts nobody holds take free slots (or the
    place of a replica held twice), then extra replicas that relieve the heaviest rank most fill the
    rest: the replica counts follow. With `counts` (the fresh ones), pairs stay up to those counts
    and the missing replicas fill the slots that frees. Returns (placement, counts, layers not under
    target); a layer whose slots cannot all be filled counts as not under target.
    """
    if counts is None:
        held = _keep_all(kept, loads, per_rank)
        _make_room(held, loads, per_rank)
        counts = _fill(held, loads, per_rank)
        placement = _layout(held, per_rank)
    else:
        held = _keep(kept, counts, loads / counts, per_rank)
        placement = _layout(held, per_rank)
        _place_missing(placement, held, loads, counts, per_rank)
    weights = loads / np.maximum(counts, 1)
    rank_load = (held * weights[:, None, :]).sum(axis=2)
    unfit = (placement < 0).any(axis=(1, 2))
    target = np.where(unfit, np.inf, target)  # nothing to swap where slots are empty
    unfit |= _swap_down(placement, rank_load, held, kept, weights, target)
    return np.sort(placement, axis=2), counts, unfit


def _place_missing(
    placement: IntArray, held: BoolArray, loads: FloatArray, counts: IntArray, per_rank: int
) -> None:
    """In place: the replicas `counts` asks for beyond those held, largest first, each onto the
    least-loaded rank with room that lacks it."""
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
        stuck = live & ~ok.any(axis=1)
        for layer in np.flatnonzero(stuck).tolist():
            _swap_in(
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


def _swap_down(
    placement: IntArray,
    rank_load: FloatArray,
    held: BoolArray,
    kept: BoolArray,
    weights: FloatArray,
    target: FloatArray,
) -> BoolArray:
    """In place: while a layer's heaviest rank is over target, trade one of its replicas for a lighter
    one of another rank, choosing the trade that adds the fewest copies, then the lowest new maximum."""
    num_layers, world, per_rank = placement.shape
    rows = np.arange(num_layers)
    stalled = np.zeros(num_layers, dtype=bool)
    for _ in range(4 * world * per_rank):
        active = np.flatnonzero((rank_load.max(axis=1) > target) & ~stalled)
        if active.size == 0:
            break
        at = rows[active][:, None]
        heavy = rank_load[active].argmax(axis=1)
        mine = placement[active, heavy]  # [A, S]
        theirs = placement[active]  # [A, W, S]
        w_mine = weights[at, mine]  # [A, S]
        w_theirs = weights[at[:, :, None], theirs]  # [A, W, S]
        delta = w_mine[:, :, None, None] - w_theirs[:, None, :, :]  # [A, S(a), W, S(b)]
        top = rank_load[active, heavy][:, None, None, None]
        other = rank_load[active][:, None, :, None]
        ok = (delta > 0) & (other + delta < top)
        ok &= ~held[at, :, mine][:, :, :, None]  # the partner must lack what it gets, and so must heavy
        ok &= ~held[at[:, :, None], heavy[:, None, None], theirs][:, None]
        # Copies the trade adds: a pair counts as a copy when the engine did not hold it before.
        a_there = kept[at, :, mine][:, :, :, None]
        a_here = kept[at, heavy[:, None], mine][:, :, None, None]
        b_here = kept[at[:, :, None], heavy[:, None, None], theirs][:, None]
        b_there = kept[at[:, :, None], np.arange(world)[None, :, None], theirs][:, None]
        copies = (~a_there).astype(np.int64) - (~a_here) + (~b_here).astype(np.int64) - (~b_there)
        peak = np.maximum(top - delta, other + delta)
        score = np.where(ok, copies * (top * 4 + 1) + peak, np.inf).reshape(active.size, -1)
        best = score.argmin(axis=1)
        found = np.isfinite(score[np.arange(active.size), best])
        stalled[active[~found]] = True
        a, r, b = np.unravel_index(best[found], (per_rank, world, per_rank))
        lay = active[found]
        h = heavy[found]
        ea = placement[lay, h, a]
        eb = placement[lay, r, b]
        placement[lay, h, a] = eb
        placement[lay, r, b] = ea
        held[lay, h, ea] = False
        held[lay, r, eb] = False
        held[lay, h, eb] = True
        held[lay, r, ea] = True
        d = weights[lay, ea] - weights[lay, eb]
        rank_load[lay, h] -= d
        rank_load[lay, r] += d
    return rank_load.max(axis=1) > target
