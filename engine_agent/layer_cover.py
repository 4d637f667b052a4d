"""The coverage pass of the planner: within the balance the plan allows (every rank at most `cap`),
cover what the slots allow (see `layer_coverage` for what covered means).

- A conversion: a replica of an expert that stays covered without it (or stays uncovered anyway) gives
  its slot to a second replica of an uncovered expert, in another unit. One copy each; the coldest
  uncovered expert first (its second replica weighs least), the slot that adds the fewest copies, then
  leaves the lowest local peak.
- A pair trade, where no conversion fits (every expert already has its replicas, but some all in one
  unit): two replicas in different units change places, so that an expert held twice in one unit gets
  one in another. Two copies for one or two experts covered.

One move per layer per round, every rank kept at most `cap[layer]`.
"""

from __future__ import annotations

import numpy as np

from engine_agent.layer_coverage import UnitCounts, per_unit_counts
from engine_agent.layer_fresh import BoolArray, FloatArray, IntArray, held_pairs

# Uncovered experts weighed per round for each layer (the coldest ones).
_RECEIVERS = 8
# Donor slots weighed per round for each layer (those that leave their other holders lightest).
_DONORS = 32
# Replicas of experts held twice or more in one unit weighed per round for a pair trade.
_PAIRS = 8


def cover(
    placement: IntArray,
    loads: FloatArray,
    kept: BoolArray,
    cap: FloatArray,
    unit: IntArray,
) -> IntArray:
    """In place and returned: conversions that cover experts, one per layer per round, each keeping
    every rank at most `cap[layer]` (see the module's rules). `kept[layer, rank, expert]`: what each
    rank held before (a conversion onto a rank that held the expert costs no copy)."""
    num_layers, world, per_rank = placement.shape
    num_logical = loads.shape[1]
    units = int(unit.max(initial=0)) + 1
    if units < 2:
        return placement
    held = held_pairs(placement, num_logical)
    counts = held.sum(axis=1)
    per_unit = per_unit_counts(held, unit, units)
    rank_load = (loads / np.maximum(counts, 1))[np.arange(num_layers)[:, None, None], placement].sum(axis=2)
    span = (per_unit > 0).sum(axis=1)  # [layer, expert]: units holding a replica
    live = np.ones(num_layers, dtype=bool)
    slot_unit = np.repeat(unit, per_rank)  # [W * S]
    slot_rank = np.repeat(np.arange(world), per_rank)
    for _ in range(world * per_rank):
        live &= (span < 2).any(axis=1)
        active = np.flatnonzero(live)
        if active.size == 0:
            break
        found, slot, receiver = _best_conversions(
            active, placement, held, kept, counts, per_unit, span, rank_load, loads, cap, unit,
            slot_unit, slot_rank,
        )  # fmt: skip
        state = (placement, held, counts, per_unit, span, rank_load, loads, unit)
        # Several per layer where their footprints (the donor rank, the donor's and the receiver's
        # holders) do not meet: each was weighed on loads no other one changes.
        touched = np.zeros((active.size, world), dtype=bool)
        donors = np.zeros((active.size, num_logical), dtype=bool)
        row = np.arange(active.size)
        for k in range(found.shape[1]):
            rank = slot_rank[slot[:, k]]
            donor = placement.reshape(num_layers, -1)[active, slot[:, k]]
            foot = held[active, :, donor] | held[active, :, receiver[:, k]]
            foot[row, rank] = True
            take = (
                found[:, k]
                & ~(foot & touched).any(axis=1)
                & ~donors[row, donor]
                & ~donors[row, receiver[:, k]]
            )
            if not take.any():
                continue
            touched |= foot & take[:, None]
            donors[row[take], donor[take]] = True
            donors[row[take], receiver[take, k]] = True
            _convert(*state, active[take], rank[take], slot[take, k] % per_rank, receiver[take, k])
        converted = np.asarray(found.any(axis=1), dtype=bool)
        rest = active[~converted]
        if rest.size:
            found, first, second = _best_pair_trade(
                rest,
                placement,
                held,
                kept,
                counts,
                per_unit,
                span,
                rank_load,
                loads,
                cap,
                slot_unit,
                slot_rank,
            )
            live[rest[~found]] = False
            layer, first, second = rest[found], first[found], second[found]
            one, other = (
                placement.reshape(num_layers, -1)[layer, first],
                placement.reshape(num_layers, -1)[layer, second],
            )
            _convert(*state, layer, slot_rank[first], first % per_rank, other)
            _convert(*state, layer, slot_rank[second], second % per_rank, one)
    return placement


def _best_conversions(
    active: IntArray,
    placement: IntArray,
    held: BoolArray,
    kept: BoolArray,
    counts: IntArray,
    per_unit: UnitCounts,
    span: IntArray,
    rank_load: FloatArray,
    loads: FloatArray,
    cap: FloatArray,
    unit: IntArray,
    slot_unit: IntArray,
    slot_rank: IntArray,
) -> tuple[BoolArray, IntArray, IntArray]:
    """Per active layer and receiver (the coldest uncovered experts, [A, K]): (found, the donor slot
    (flat rank * S + slot), the receiving expert)."""
    size = active.size
    row = np.arange(size)[:, None]
    num_logical = loads.shape[1]
    load, count = loads[active], counts[active]
    # Receivers: the coldest uncovered experts.
    key = np.where(span[active] < 2, load, np.inf)
    take = min(_RECEIVERS, num_logical)
    receivers = np.argsort(key, axis=1, kind="stable")[:, :take]  # [A, K]
    usable = np.isfinite(np.take_along_axis(key, receivers, axis=1))
    # Gathers go through flat indices (`take`): several times faster than broadcast index arrays.
    world, units = placement.shape[1], per_unit.shape[1]
    unit_rows = (active[:, None, None] * units + np.arange(units)) * num_logical
    # The unit of an uncovered expert's replicas (all in one unit).
    home = per_unit.reshape(-1).take(unit_rows + receivers[:, :, None]).argmax(axis=2)  # [A, K]
    # Donors: every slot whose expert keeps a replica and stays covered (if it was) without it.
    slots = placement[active].reshape(size, -1)  # [A, W*S]
    by_slot = row * num_logical + slots  # [A, W*S]: (active layer, the slot's expert)
    donor_count = count.reshape(-1).take(by_slot)
    in_unit = per_unit.reshape(-1).take((active[:, None] * units + slot_unit[None, :]) * num_logical + slots)
    donor_span = span[active].reshape(-1).take(by_slot)
    after_span = donor_span - (in_unit == 1)
    can_give = (donor_count >= 2) & ~((donor_span >= 2) & (after_span < 2))
    slot_load = load.reshape(-1).take(by_slot)
    share = slot_load / np.maximum(donor_count, 1)
    gain = slot_load / np.maximum(donor_count - 1, 1) - share  # each other holder's increase
    loads_at = rank_load[active][:, slot_rank]
    others = _other_holders_peak(slots, loads_at, num_logical) + gain  # every other holder, after
    capped = cap[active][:, None]
    # Only the donors that fit weigh on: the `_DONORS` that leave their other holders lightest.
    donor_key = np.where(can_give & (others <= capped), others, np.inf)
    take = min(_DONORS, slots.shape[1])
    picked = np.argpartition(donor_key, take - 1, axis=1)[:, :take] if take < slots.shape[1] else None
    if picked is None:
        picked = np.broadcast_to(np.arange(slots.shape[1]), slots.shape)
    fine = np.isfinite(np.take_along_axis(donor_key, picked, axis=1))  # [A, D]
    donor_slots = np.take_along_axis(slots, picked, axis=1)
    donor_rank, donor_unit = slot_rank[picked], slot_unit[picked]
    share, others = np.take_along_axis(share, picked, axis=1), np.take_along_axis(others, picked, axis=1)
    loads_at = np.take_along_axis(loads_at, picked, axis=1)
    receiver_share = load[row, receivers] / (count[row, receivers] + 1)  # [A, K]
    own = loads_at[:, None, :] - share[:, None, :] + receiver_share[:, :, None]  # [A, K, D]
    fits = fine[:, None, :] & (own <= capped[:, :, None])
    fits &= usable[:, :, None] & (donor_unit[:, None, :] != home[:, :, None])
    donor_rows = (active[:, None] * world + donor_rank) * num_logical  # [A, D]
    at_receiver = donor_rows[:, None, :] + receivers[:, :, None]  # [A, K, D]
    fits &= ~held.reshape(-1).take(at_receiver)  # the rank must lack the receiver
    # Fewest copies first (a rank that held the receiver before takes it back for free; dropping a
    # replica that was itself a copy saves one), then the lowest local peak.
    copy_in = ~kept.reshape(-1).take(at_receiver)
    copy_out = ~kept.reshape(-1).take(donor_rows + donor_slots)
    copies = copy_in.astype(np.int64) - copy_out[:, None, :]
    peak = np.maximum(own, others[:, None, :])
    score = np.where(fits, copies * (4 * capped[:, :, None] + 1) + peak, np.inf)  # [A, K, D]
    best = score.argmin(axis=2)
    found = np.isfinite(np.take_along_axis(score, best[:, :, None], axis=2)[:, :, 0])
    slot = np.take_along_axis(picked, best, axis=1)
    return found, slot, receivers


def _best_pair_trade(
    active: IntArray,
    placement: IntArray,
    held: BoolArray,
    kept: BoolArray,
    counts: IntArray,
    per_unit: UnitCounts,
    span: IntArray,
    rank_load: FloatArray,
    loads: FloatArray,
    cap: FloatArray,
    slot_unit: IntArray,
    slot_rank: IntArray,
) -> tuple[BoolArray, IntArray, IntArray]:
    """Per active layer: (found, first slot, second slot) of the trade that covers the most experts,
    then adds the fewest copies, then leaves the lowest peak of the two ranks. The first slot holds a
    replica of an expert held two or more times, all in one unit."""
    size = active.size
    row = np.arange(size)[:, None]
    slots = placement[active].reshape(size, -1)  # [A, W*S]
    count, load = counts[active], loads[active]
    lone = (span[active][row, slots] == 1) & (count[row, slots] >= 2)
    if not lone.any():  # every expert held twice spans two units (always so with one engine per unit)
        nothing = np.zeros(size, dtype=np.int64)
        return np.zeros(size, dtype=bool), nothing, nothing
    take = min(_PAIRS, slots.shape[1])
    firsts = np.argsort(~lone, axis=1, kind="stable")[:, :take]  # [A, P]: such slots first
    usable = np.take_along_axis(lone, firsts, axis=1)
    u = np.take_along_axis(slots, firsts, axis=1)  # [A, P]
    a, unit_a = slot_rank[firsts], slot_unit[firsts]
    v, b, unit_b = slots[:, None, :], slot_rank[None, None, :], slot_unit[None, None, :]
    at = active[:, None, None]
    weight_u = (load[row, u] / count[row, u])[:, :, None]
    weight_v = (load[row, slots] / np.maximum(count[row, slots], 1))[:, None, :]
    loads_now = rank_load[active]
    after_a = loads_now[row, a][:, :, None] - weight_u + weight_v
    after_b = loads_now[row[:, :, None], b] + weight_u - weight_v
    ok = usable[:, :, None] & (unit_b != unit_a[:, :, None]) & (v != u[:, :, None])
    ok &= ~held[at, a[:, :, None], v] & ~held[at, b, u[:, :, None]]
    capped = cap[active][:, None, None]
    ok &= (after_a <= capped) & (after_b <= capped)
    # Experts covered after the trade less before: u gains unit b; v leaves unit b for unit a.
    u_span = span[active][row, u][:, :, None] + (per_unit[at, unit_b, u[:, :, None]] == 0)
    v_now = span[active][row, slots][:, None, :]
    v_span = v_now - (per_unit[at, unit_b, v] == 1) + (per_unit[at, unit_a[:, :, None], v] == 0)
    gain = (u_span >= 2).astype(np.int64) + (v_span >= 2) - (v_now >= 2)
    ok &= gain >= 1
    copies = (~kept[at, b, u[:, :, None]]).astype(np.int64) + ~kept[at, a[:, :, None], v]
    scale = 4 * capped + 1
    score = np.where(ok, (copies - 4 * gain) * scale + np.maximum(after_a, after_b), np.inf).reshape(size, -1)
    best = score.argmin(axis=1)
    found = np.isfinite(score[np.arange(size), best])
    p, second = np.divmod(best, slots.shape[1])
    return found, firsts[np.arange(size), p], second


def _other_holders_peak(slots: IntArray, loads_at: FloatArray, num_logical: int) -> FloatArray:
    """[A, W*S]: the heaviest load among the other holders of each slot's expert (-inf: none). Only
    the slots whose expert fills two or more slots of the layer are weighed (a few of them)."""
    size = slots.shape[0]
    key = np.arange(size)[:, None] * num_logical + slots
    many = np.bincount(key.ravel(), minlength=size * num_logical)[key] >= 2
    peak = np.full(slots.shape, -np.inf)
    row, column = np.nonzero(many)
    index = (row, slots[row, column])
    load = loads_at[row, column]
    first = np.full((size, num_logical), -np.inf)
    np.maximum.at(first, index, load)
    top = first[index]
    at_top = load == top
    ties = np.zeros((size, num_logical), dtype=np.int64)
    np.add.at(ties, index, at_top.astype(np.int64))
    second = np.full((size, num_logical), -np.inf)
    np.maximum.at(second, index, np.where(at_top, -np.inf, load))
    peak[row, column] = np.where(at_top & (ties[index] == 1), second[index], top)
    return peak


def _convert(
    placement: IntArray,
    held: BoolArray,
    counts: IntArray,
    per_unit: UnitCounts,
    span: IntArray,
    rank_load: FloatArray,
    loads: FloatArray,
    unit: IntArray,
    layer: IntArray,
    rank: IntArray,
    position: IntArray,
    receiver: IntArray,
) -> None:
    """One conversion per layer (vectors of one entry per layer): the slot's expert gives way to the
    receiver; every holder's load follows the new replica counts."""
    donor = placement[layer, rank, position]
    for expert, delta in ((donor, -1), (receiver, 1)):
        before = loads[layer, expert] / np.maximum(counts[layer, expert], 1)
        counts[layer, expert] += delta
        after = loads[layer, expert] / np.maximum(counts[layer, expert], 1)
        if delta < 0:
            held[layer, rank, expert] = False
            rank_load[layer, rank] -= before
            per_unit[layer, unit[rank], expert] -= 1
            span[layer, expert] -= per_unit[layer, unit[rank], expert] == 0
        rank_load[layer] += held[layer, :, expert] * (after - before)[:, None]
        if delta > 0:
            held[layer, rank, expert] = True
            rank_load[layer, rank] += after
            span[layer, expert] += per_unit[layer, unit[rank], expert] == 0
            per_unit[layer, unit[rank], expert] += 1
    placement[layer, rank, position] = receiver
