"""The swap-down of `layer_moves.incremental`: trades between a layer's heaviest rank and another until
every rank is under target, each the trade that adds the fewest copies, then leaves the lowest peak.

Shapes as in `layer_placement`: `placement[layer, rank, slot]`, `held[layer, rank, expert]`.
"""

from __future__ import annotations

import numpy as np

from engine_agent.layer_fresh import BoolArray, FloatArray, IntArray

# Added to the score of a trade that does not lower the peak: beyond any valid score (copies count
# a few times the heavy rank's load), finite so that 0 x it stays 0.
_INVALID = 1e300


def swap_down(
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
    experts = held.shape[2]
    if not (held.flags.c_contiguous and placement.flags.c_contiguous):
        raise ValueError("swap_down updates placement and held through flat views: pass contiguous arrays")
    stalled = np.zeros(num_layers, dtype=bool)
    held_t = np.ascontiguousarray(held.transpose(0, 2, 1))  # [layer, expert, rank]
    kept_t = np.ascontiguousarray(kept.transpose(0, 2, 1))
    # Whether each slot's replica was there before (a trade that moves a copy away saves one).
    kept_slot = kept[np.arange(num_layers)[:, None, None], np.arange(world)[None, :, None], placement]
    # Gathers go through flat indices (`take`): several times faster than indexing with broadcast
    # index arrays.
    held_flat, held_t_flat, kept_flat = held.reshape(-1), held_t.reshape(-1), kept.reshape(-1)
    weights_flat = weights.reshape(-1)
    slot_rows = placement.reshape(num_layers * world, per_rank)
    kept_slot_rows = kept_slot.reshape(num_layers * world, per_rank)
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
        heavy_row = active * world + heavy  # [A]: (layer, heavy rank) as one index
        mine = slot_rows[heavy_row]  # [A, S]
        theirs = placement[active].reshape(size, -1)  # [A, W * S]
        base = (active * experts)[:, None]
        w_mine = weights_flat.take(base + mine)
        w_theirs = weights_flat.take(base + theirs)  # [A, W * S]
        # a -> r: a copy unless r kept a; one saved if a was a copy on the heavy rank.
        to_r = (~kept_t[active[:, None], mine]).astype(np.float64) - (~kept_slot_rows[heavy_row])[:, :, None]
        to_r *= per_copy
        np.copyto(to_r, np.inf, where=held_t[active[:, None], mine])  # [A, S, W]
        # b -> heavy: a copy unless the heavy rank kept b; one saved if b was a copy on r.
        at_heavy = (heavy_row * experts)[:, None] + theirs  # [A, W * S]: (layer, heavy rank, b)
        to_h = (~kept_flat.take(at_heavy)).astype(np.float64) - ~kept_slot[active].reshape(size, -1)
        to_h *= per_copy[:, :, 0]
        np.copyto(to_h, np.inf, where=held_flat.take(at_heavy))  # [A, W * S]
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
        for gone_rank, gone, stays in ((h, ea, False), (r, eb, False), (h, eb, True), (r, ea, True)):
            held_flat[(lay * world + gone_rank) * experts + gone] = stays
            held_t_flat[(lay * experts + gone) * world + gone_rank] = stays
        kept_slot[lay, h, a] = kept[lay, h, eb]
        kept_slot[lay, r, b] = kept[lay, r, ea]
        d = weights[lay, ea] - weights[lay, eb]
        rank_load[lay, h] -= d
        rank_load[lay, r] += d
    return rank_load.max(axis=1) > target
