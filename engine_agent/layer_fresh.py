"""A fresh per-layer placement (no previous one): replica counts, then largest replica first onto the
least-loaded rank with room, every layer at once.

Shapes as in `layer_placement`: `loads[layer, expert]`, `placement[layer, rank, slot]`,
`held[layer, rank, expert]`. The rules are those of `placement.rebalance` (pure Python, one layer), and
the results the same; only the way of computing them is batched:
- counts: the greedy "next replica to the highest load per replica" keeps each layer's candidate values
  in one array and updates one entry per step (no division over the whole array);
- packing: replicas sorted by weight, each onto the lightest rank with room that lacks the expert. A
  run of consecutive replicas goes to consecutive ranks of the load order in one step as long as each
  would be the lightest after the ones before it landed (so a step places up to `world` replicas, not
  one): about `slots per rank` steps instead of one per replica.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def held_pairs(placement: IntArray, num_logical: int) -> BoolArray:
    """held[layer, rank, expert]: the rank holds at least one replica of the expert."""
    num_layers, world, _ = placement.shape
    held = np.zeros((num_layers, world, num_logical), dtype=bool)
    layer = np.arange(num_layers)[:, None, None]
    rank = np.arange(world)[None, :, None]
    held[layer, rank, placement] = True
    return held


def replica_counts(loads: FloatArray, total_slots: int, world_size: int, floor: int = 1) -> IntArray:
    """counts[layer, expert]: `floor` each (two: every expert covered), then every extra slot to the
    highest load per replica (ties: lowest id). No expert gets more replicas than ranks until every
    expert sits on every rank."""
    num_layers, num_logical = loads.shape
    floor = max(1, min(floor, world_size))
    counts = np.full((num_layers, num_logical), floor, dtype=np.int64)
    extra = total_slots - floor * num_logical
    if extra <= 0:
        return counts
    if extra >= num_logical * (world_size - floor):
        return _counts_past_every_rank(loads, counts, extra, world_size)
    # Each expert's load per replica (what the next replica is chosen by), updated where it changes;
    # an expert on every rank takes no more (-inf).
    value = loads / floor if floor < world_size else np.full_like(loads, -np.inf)
    flat_value, flat_counts, flat_loads = value.ravel(), counts.ravel(), loads.ravel()
    base = np.arange(num_layers) * num_logical
    for _ in range(extra):
        at = base + value.argmax(axis=1)
        now = flat_counts[at] + 1
        flat_counts[at] = now
        flat_value[at] = np.where(now >= world_size, -np.inf, flat_loads[at] / now)
    return counts


def _counts_past_every_rank(loads: FloatArray, counts: IntArray, extra: int, world_size: int) -> IntArray:
    """Enough slots for every expert on every rank: the plain greedy, lifting the cap once every
    expert of a layer has reached it."""
    rows = np.arange(loads.shape[0])
    for _ in range(extra):
        per_replica = loads / counts
        key = np.where(counts >= world_size, -np.inf, per_replica)
        everywhere = np.isneginf(key).all(axis=1)
        if everywhere.any():
            key[everywhere] = per_replica[everywhere]
        counts[rows, key.argmax(axis=1)] += 1
    return counts


def sorted_replicas(loads: FloatArray, counts: IntArray, total: int) -> tuple[IntArray, FloatArray]:
    """Every layer's replicas, largest load per replica first: (experts [layer, i], weights)."""
    num_layers, num_logical = loads.shape
    per_replica = loads / counts
    experts = np.repeat(np.tile(np.arange(num_logical), num_layers), counts.ravel()).reshape(
        num_layers, total
    )
    weights = np.take_along_axis(per_replica, experts, axis=1)
    order = np.argsort(-weights, axis=1, kind="stable")
    return np.take_along_axis(experts, order, axis=1), np.take_along_axis(weights, order, axis=1)


def fresh_placement(
    loads: FloatArray, counts: IntArray, world: int, per_rank: int, unit: IntArray | None = None
) -> IntArray:
    """Largest replica first onto the least-loaded rank with room that lacks the expert (doubling up
    only when every rank with room holds it): the rule of `placement.rebalance`, over all layers.
    With `unit` (each rank's failure unit), an expert's second replica avoids the unit of its first
    where a rank with room elsewhere lacks it."""
    num_layers, num_logical = loads.shape
    total = world * per_rank
    experts, weights = sorted_replicas(loads, counts, total)
    per_replica = loads / counts
    rank_load = np.zeros((num_layers, world))
    used = np.zeros((num_layers, world), dtype=np.int64)
    held = np.zeros((num_layers, world, num_logical), dtype=bool)
    placement = np.empty((num_layers, world, per_rank), dtype=np.int64)
    done = np.zeros(num_layers, dtype=np.int64)  # replicas placed so far, per layer
    window = np.arange(world)
    # Where coverage is a goal: each expert's first unit (-1: none yet), and whether it spans two.
    home = np.full((num_layers, num_logical), -1, dtype=np.int64)
    spread = np.zeros((num_layers, num_logical), dtype=bool)
    while True:
        live = np.flatnonzero(done < total)
        if live.size == 0:
            break
        key = np.where(used[live] < per_rank, rank_load[live], np.inf)
        order = np.argsort(key, axis=1, kind="stable")  # lightest first, ties by rank
        lightest = np.take_along_axis(key, order, axis=1)
        position = done[live][:, None] + window
        inside = position < total
        position = np.minimum(position, total - 1)
        expert = experts[live[:, None], position]
        weight = weights[live[:, None], position]
        # Replica j goes to the j-th lightest rank if that rank is lighter than every rank before it
        # once those got theirs (strictly: a tie goes to the lower rank, as one argmin would).
        before = np.minimum.accumulate(lightest + weight, axis=1)
        takes = np.ones_like(inside)
        takes[:, 1:] = lightest[:, 1:] < before[:, :-1]
        takes &= inside & np.isfinite(lightest) & ~held[live[:, None], order, expert]
        if unit is not None:
            lone = np.where(spread[live[:, None], expert], -2, home[live[:, None], expert])
            takes &= ~_same_unit(lone, expert, unit[order])
        run = np.where(takes.all(axis=1), world, takes.argmin(axis=1))
        stuck = np.flatnonzero(run == 0)
        if stuck.size:  # the lightest rank holds it (or its unit does): the one-replica rule
            _place_first(
                placement, used, held, rank_load, per_replica, home, spread, unit, live[stuck],
                expert[stuck, 0], weight[stuck, 0],
            )  # fmt: skip
        row, j = np.nonzero(window[None, :] < run[:, None])
        layer, rank, chosen = live[row], order[row, j], expert[row, j]
        if unit is not None:
            _note_units(home, spread, layer, chosen, unit[rank])
        placement[layer, rank, used[layer, rank]] = chosen
        used[layer, rank] += 1
        rank_load[layer, rank] += weight[row, j]
        held[layer, rank, chosen] = True
        done[live] += np.maximum(run, 1)
    return np.sort(placement, axis=2)


def _same_unit(lone: IntArray, expert: IntArray, unit_of_rank: IntArray) -> BoolArray:
    """[layer, j] for a run of replicas (an expert's replicas are consecutive): would replica j be its
    expert's second in the unit of its first? `lone`: the unit of the expert's only unit so far (-1:
    none yet, -2: it spans two already); the first may also be replica j - 1, in this run."""
    before = np.zeros_like(lone, dtype=bool)
    before[:, 1:] = expert[:, 1:] == expert[:, :-1]
    second_after_first = (lone >= 0) & ~before & (lone == unit_of_rank)
    first_just_before = np.zeros_like(before)
    first_just_before[:, 1:] = before[:, 1:] & (lone[:, :-1] == -1) & ~before[:, :-1]
    second_in_run = np.zeros_like(before)
    second_in_run[:, 1:] = first_just_before[:, 1:] & (unit_of_rank[:, 1:] == unit_of_rank[:, :-1])
    return second_after_first | second_in_run


def _note_units(home: IntArray, spread: BoolArray, layer: IntArray, expert: IntArray, unit: IntArray) -> None:
    """In place: the units of replicas just placed (an expert's replicas in the order placed)."""
    new = home[layer, expert] < 0
    first = new.copy()
    first[1:] &= ~((layer[1:] == layer[:-1]) & (expert[1:] == expert[:-1]))
    home[layer[first], expert[first]] = unit[first]
    spread[layer, expert] |= home[layer, expert] != unit


def _place_first(
    placement: IntArray,
    used: IntArray,
    held: BoolArray,
    rank_load: FloatArray,
    weights: FloatArray,
    home: IntArray,
    spread: BoolArray,
    unit: IntArray | None,
    layers: IntArray,
    experts: IntArray,
    weight: FloatArray,
) -> None:
    """In place, one replica per layer: onto the least-loaded rank with room that lacks it (and, with
    `unit`, outside the unit of its first replica where possible), else `swap_in`."""
    per_rank = placement.shape[2]
    room = (used[layers] < per_rank) & ~held[layers, :, experts]  # [A, W]
    if unit is not None:
        away = room & (unit[None, :] != home[layers, experts][:, None])
        lone = (home[layers, experts] >= 0) & ~spread[layers, experts]
        room = np.where((away.any(axis=1) & lone)[:, None], away, room)
    has = room.any(axis=1)
    for i in np.flatnonzero(~has):
        layer = int(layers[i])
        swap_in(placement[layer], used[layer], held[layer], rank_load[layer], weights[layer], int(experts[i]))
    layers, experts, weight, room = layers[has], experts[has], weight[has], room[has]
    rank = np.where(room, rank_load[layers], np.inf).argmin(axis=1)
    placement[layers, rank, used[layers, rank]] = experts
    used[layers, rank] += 1
    rank_load[layers, rank] += weight
    held[layers, rank, experts] = True
    if unit is not None:
        _note_units(home, spread, layers, experts, unit[rank])


def swap_in(
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
