"""Expert placement: which logical expert sits in which physical slot of which rank, and the weight
moves a new placement needs.

Pure Python on purpose (no torch, no numpy): the coordinator imports it to compute the placement it
sends in every prepare.

A placement is `placement[rank][slot] = logical expert id`. Every rank has the same number of slots,
`slots_per_rank(L, R, W)`; slots beyond the L + R the model asks for become extra replicas.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


def slots_per_rank(num_logical: int, num_redundant: int, world_size: int) -> int:
    """Physical expert slots on each rank: ceil((L + R) / W)."""
    if num_logical < 1:
        raise ValueError(f"num_logical must be >= 1, got {num_logical}")
    if num_redundant < 0:
        raise ValueError(f"num_redundant must be >= 0, got {num_redundant}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return -(-(num_logical + num_redundant) // world_size)


def _normalized_load(expert_load: Sequence[float], num_logical: int | None) -> list[float]:
    """The load to balance: all zeros or empty means uniform."""
    loads = [float(x) for x in expert_load]
    if not loads:
        if num_logical is None:
            raise ValueError("expert_load is empty and num_logical is not given: no experts to place")
        return [1.0] * num_logical
    if num_logical is not None and num_logical != len(loads):
        raise ValueError(f"expert_load has {len(loads)} entries but num_logical is {num_logical}")
    for expert, load in enumerate(loads):
        if load < 0 or load != load:  # NaN is the only value unequal to itself
            raise ValueError(f"expert {expert} has an invalid load {load!r}")
    if sum(loads) == 0:
        return [1.0] * len(loads)
    return loads


def _replica_counts(loads: list[float], total_slots: int, world_size: int) -> list[int]:
    """One replica per expert, then each extra slot to the expert with the highest load per replica
    (ties: fewer replicas, then lower id). An expert gets more than one replica per rank only once every
    expert already has one on every rank."""
    num_logical = len(loads)
    counts = [1] * num_logical
    extra = total_slots - num_logical
    # Heap keys: (-load per replica, replicas, id): the first is the expert that gains most.
    heap = [(-loads[e], 1, e) for e in range(num_logical)]
    heapq.heapify(heap)
    capped: list[int] = []
    while extra > 0:
        if not heap:
            # Every expert sits on every rank: further replicas must double up on some rank.
            heap = [(-loads[e] / counts[e], counts[e], e) for e in capped]
            heapq.heapify(heap)
            capped = []
            world_size = 1 << 62  # no cap from here on
        _, _, expert = heapq.heappop(heap)
        counts[expert] += 1
        extra -= 1
        if counts[expert] >= world_size:
            capped.append(expert)
        else:
            heapq.heappush(heap, (-loads[expert] / counts[expert], counts[expert], expert))
    return counts


def _pack(loads: list[float], counts: list[int], world_size: int, per_rank: int) -> list[list[int]]:
    """Largest replica first onto the least-loaded rank with a free slot that does not hold it yet."""
    replicas = sorted(
        ((loads[e] / counts[e], e) for e in range(len(loads)) for _ in range(counts[e])),
        key=lambda item: (-item[0], item[1]),
    )
    per_replica = [loads[e] / counts[e] for e in range(len(loads))]
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    rank_load = [0.0] * world_size

    def fits(rank: int, expert: int) -> bool:
        return len(ranks[rank]) < per_rank and expert not in ranks[rank]

    for load, expert in replicas:
        open_ranks = [r for r in range(world_size) if fits(r, expert)]
        if open_ranks:
            target = min(open_ranks, key=lambda r: (rank_load[r], len(ranks[r]), r))
            ranks[target].append(expert)
            rank_load[target] += load
            continue
        if not _swap_in(ranks, rank_load, per_replica, expert, per_rank):
            # Unavoidable (more replicas than ranks): double up on the least-loaded rank with room.
            target = min(
                (r for r in range(world_size) if len(ranks[r]) < per_rank),
                key=lambda r: (rank_load[r], len(ranks[r]), r),
            )
            ranks[target].append(expert)
            rank_load[target] += load
    return [sorted(slots) for slots in ranks]


def _swap_in(
    ranks: list[list[int]], rank_load: list[float], per_replica: list[float], expert: int, per_rank: int
) -> bool:
    """Every rank with a free slot already holds `expert`: move some other expert from a full rank that
    lacks `expert` into the free slot and put `expert` in its place. Picks the move that leaves the
    heavier of the two ranks lightest. Returns False when no such move exists."""
    best: tuple[float, int, int, int] | None = None  # (resulting max load, free rank, full rank, moved)
    for free in range(len(ranks)):
        if len(ranks[free]) >= per_rank:
            continue
        for full in range(len(ranks)):
            if full == free or expert in ranks[full] or len(ranks[full]) < per_rank:
                continue
            for moved in sorted(set(ranks[full])):
                if moved in ranks[free]:
                    continue
                free_after = rank_load[free] + per_replica[moved]
                full_after = rank_load[full] - per_replica[moved] + per_replica[expert]
                key = (max(free_after, full_after), free, full, moved)
                if best is None or key < best:
                    best = key
    if best is None:
        return False
    _, free, full, moved = best
    ranks[full].remove(moved)
    ranks[full].append(expert)
    ranks[free].append(moved)
    rank_load[free] += per_replica[moved]
    rank_load[full] += per_replica[expert] - per_replica[moved]
    return True


def rebalance(
    expert_load: Sequence[float], num_redundant: int, world_size: int, *, num_logical: int | None = None
) -> list[list[int]]:
    """placement[rank][slot] = logical expert id, for the measured load of each logical expert.

    Every logical expert is placed at least once; the placement has exactly
    `world_size * slots_per_rank` slots. Hot experts get the redundant replicas (greedy by load per
    replica), then replicas are packed onto ranks largest first, each onto the least-loaded rank with
    a free slot, never two replicas of one expert on one rank when avoidable. Deterministic: ties go
    by expert id and rank index. An all-zero load is uniform; an empty load is uniform over
    `num_logical` experts (which must then be given).
    """
    loads = _normalized_load(expert_load, num_logical)
    per_rank = slots_per_rank(len(loads), num_redundant, world_size)
    counts = _replica_counts(loads, world_size * per_rank, world_size)
    return _pack(loads, counts, world_size, per_rank)


def round_robin(num_logical: int, num_redundant: int, world_size: int) -> list[list[int]]:
    """The load-blind placement: slot i of the flattened layout holds expert i mod L."""
    per_rank = slots_per_rank(num_logical, num_redundant, world_size)
    return [[(r * per_rank + s) % num_logical for s in range(per_rank)] for r in range(world_size)]


def _replica_count_map(placement: list[list[int]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for slots in placement:
        for expert in slots:
            counts[expert] = counts.get(expert, 0) + 1
    return counts


def rank_loads(placement: list[list[int]], expert_load: Sequence[float]) -> list[float]:
    """Load on each rank, each expert's load split evenly across its replicas."""
    counts = _replica_count_map(placement)
    return [sum(float(expert_load[e]) / counts[e] for e in slots) for slots in placement]


def balance_ratio(placement: list[list[int]], expert_load: Sequence[float]) -> float:
    """max / mean rank load (1.0 is perfect balance; 1.0 when there is no load at all)."""
    loads = rank_loads(placement, expert_load)
    mean = sum(loads) / len(loads) if loads else 0.0
    if mean == 0:
        return 1.0
    return max(loads) / mean


def validate_placement(placement: list[list[int]], num_logical: int) -> None:
    """Raise ValueError naming the first problem: no ranks, empty or ragged ranks, ids out of range,
    or logical experts placed nowhere."""
    if not placement:
        raise ValueError("placement has no ranks")
    per_rank = len(placement[0])
    if per_rank == 0:
        raise ValueError("rank 0 has no slots")
    for rank, slots in enumerate(placement):
        if len(slots) != per_rank:
            raise ValueError(f"rank {rank} has {len(slots)} slots, rank 0 has {per_rank}")
        for slot, expert in enumerate(slots):
            if not isinstance(expert, int) or isinstance(expert, bool) or not 0 <= expert < num_logical:
                raise ValueError(
                    f"rank {rank} slot {slot} holds {expert!r}, not a logical expert id in [0, {num_logical})"
                )
    missing = sorted(set(range(num_logical)) - {e for slots in placement for e in slots})
    if missing:
        raise ValueError(f"logical experts placed nowhere: {missing}")


def replica_map(placement: list[list[int]]) -> dict[int, list[tuple[int, int]]]:
    """logical expert -> [(rank, slot)] of its replicas, in rank, slot order; keys in id order."""
    replicas: dict[int, list[tuple[int, int]]] = {}
    for rank, slots in enumerate(placement):
        for slot, expert in enumerate(slots):
            replicas.setdefault(expert, []).append((rank, slot))
    return dict(sorted(replicas.items()))


@dataclass(frozen=True)
class TransferItem:
    """One expert's weights to move to one engine of the new generation."""

    logical_expert: int
    src: str | None  # engine_id of a holder in the old generation; None = load from the checkpoint
    dst: str  # engine_id in the new generation that needs it and does not hold it already


def _check_members(members: Sequence[str], placement: list[list[int]], what: str) -> None:
    if len(set(members)) != len(members):
        raise ValueError(f"{what} members repeat an engine id: {list(members)}")
    if len(members) != len(placement):
        raise ValueError(f"{what} placement has {len(placement)} ranks for {len(members)} members")


def plan_transfers(
    old_members: Sequence[str],
    old_placement: list[list[int]],
    new_members: Sequence[str],
    new_placement: list[list[int]],
) -> list[TransferItem]:
    """The expert moves that turn the old placement into the new one.

    One item per (dst engine, logical expert) that dst needs and lacks in its old slots. The source is
    a holder in the old generation: engines that stay are preferred over engines that leave (a leaver
    serves only what nobody else holds), then the least used so far, then the lowest old rank. Experts
    no old engine holds come from the checkpoint (src None). Sorted by (logical expert, dst) so every
    participant iterates it in the same order.
    """
    _check_members(old_members, old_placement, "old")
    _check_members(new_members, new_placement, "new")
    staying = set(new_members)
    held: dict[str, set[int]] = {
        engine: set(slots) for engine, slots in zip(old_members, old_placement, strict=True)
    }
    holders: dict[int, list[int]] = {}  # logical -> old ranks holding it, in rank order
    for rank, slots in enumerate(old_placement):
        for expert in sorted(set(slots)):
            holders.setdefault(expert, []).append(rank)

    needs = sorted(
        (expert, dst)
        for dst, slots in zip(new_members, new_placement, strict=True)
        for expert in set(slots)
        if expert not in held.get(dst, set())
    )
    times_used = [0] * len(old_members)
    plan: list[TransferItem] = []
    for expert, dst in needs:
        candidates = holders.get(expert, [])
        if not candidates:
            plan.append(TransferItem(expert, None, dst))
            continue
        rank = min(candidates, key=lambda r: (old_members[r] not in staying, times_used[r], r))
        times_used[rank] += 1
        plan.append(TransferItem(expert, old_members[rank], dst))
    return plan


def plan_layer_transfers(
    old_members: Sequence[str],
    old_placements: Sequence[list[list[int]]],
    new_members: Sequence[str],
    placements: Sequence[list[list[int]]],
    num_logical: int,
) -> list[TransferItem]:
    """`plan_transfers` for every MoE layer; items name experts by flat id (`layer * num_logical +
    expert`), so one channel moves every layer's weights. Sorted by (flat id, dst)."""
    plan: list[TransferItem] = []
    for layer, new_placement in enumerate(placements):
        old_placement = old_placements[layer] if old_placements else []
        base = layer * num_logical
        for item in plan_transfers(old_members, old_placement, new_members, new_placement):
            plan.append(TransferItem(base + item.logical_expert, item.src, item.dst))
    return plan
