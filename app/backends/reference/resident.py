"""After a loss, serve from what the survivors hold (pure rules; the planner applies them).

When a member dies, the survivors leave the broken group and go idle, but they keep the expert rows
they served from and report them (`AgentInfo.resident`: the broken generation, their rank in it, its
placement). A job that forms a new generation with nobody serving (a self-heal shrink, or a group
re-formed where it broke) plans from those rows as it would from an old generation's:

- `resident_rows`: the previous placement made of the rows the new members hold from the generation
  the deployment was serving, and `origin[new rank]` (the row that member holds; None: it holds none:
  a fresh engine, or rows of another generation). None when no member holds any.
- `kept_placement`: where every new member holds rows and together they place every expert of every
  layer (the loss was covered: each expert had a replica elsewhere), the new placement is those rows
  as they are. Nothing loads from the checkpoint or crosses the network; the job's placement record
  says 0 bytes. Balance and coverage are the survivors' as they stand: growing back re-plans both.
  Otherwise the planner rebalances from the rows (what a survivor holds stays; only what the loss took
  loads from the checkpoint).
- `spare_filled` (issue 38, warm spares): where the new members are the survivors and as many warm spares
  (`AgentInfo.spare_bytes`: each holds every expert) as ranks were lost, the new placement is the broken
  generation's as it was, each spare on a lost rank's rows: nothing is re-planned, the survivors keep
  their rows and the spares copy theirs from what they hold (0 bytes loaded or received; balance and
  coverage as before the loss).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_agent.protocol import AgentInfo

Placements = list[list[list[int]]]  # [layer][rank][slot] = logical expert


def resident_rows(
    generation: int, infos: Sequence[AgentInfo], num_layers: int
) -> tuple[Placements, list[int | None]] | None:
    """(previous placement [layer][holder][slot], origin[new rank]) from what the new members
    (`infos`, in new rank order) hold of `generation`; rows of other shapes are ignored."""
    if generation < 1:
        return None
    previous: Placements = [[] for _ in range(num_layers)]
    origin: list[int | None] = []
    slots: int | None = None
    for info in infos:
        held = info.resident
        ours = held is not None and held.generation == generation
        rows = _rows(held.placements, held.rank, num_layers) if held is not None and ours else None
        if rows is None or (slots is not None and any(len(row) != slots for row in rows)):
            origin.append(None)
            continue
        slots = len(rows[0])
        origin.append(len(previous[0]))
        for layer, row in enumerate(rows):
            previous[layer].append(row)
    if slots is None:
        return None
    return previous, origin


def _rows(placements: Placements, rank: int, num_layers: int) -> list[list[int]] | None:
    """The rows `rank` holds, one per layer, when the placement has that many layers and a rank
    `rank` whose rows are non-empty and of one length."""
    if len(placements) != num_layers or any(not 0 <= rank < len(layer) for layer in placements):
        return None
    rows = [list(layer[rank]) for layer in placements]
    if not rows or not rows[0] or any(len(row) != len(rows[0]) for row in rows):
        return None
    return rows


def kept_placement(previous: Placements, origin: Sequence[int | None], num_logical: int) -> Placements | None:
    """The members' resident rows as the new placement, when every member holds rows and every
    layer places every expert; else None (the loss was not covered, or a member holds nothing)."""
    if not previous or not origin or any(holder is None for holder in origin):
        return None
    placements = [[list(layer[holder]) for holder in origin if holder is not None] for layer in previous]
    every = set(range(num_logical))
    if any(every - {e for row in layer for e in row} for layer in placements):
        return None
    return placements


def spare_filled(generation: int, infos: Sequence[AgentInfo], num_layers: int) -> Placements | None:
    """[layer][new rank][slot]: the broken `generation`'s placement with the lost ranks' rows on the warm
    spares among `infos` (new rank order; survivors keep their own rows), when the spares are exactly
    as many as the ranks no survivor holds; else None."""
    if generation < 1:
        return None
    full: Placements | None = None
    survivor_rank: dict[int, int] = {}  # index in infos -> its rank in the broken generation
    spares: list[int] = []
    for index, info in enumerate(infos):
        held = info.resident
        if held is not None and held.generation == generation:
            if _rows(held.placements, held.rank, num_layers) is None:
                return None
            full = full if full is not None else held.placements
            if held.placements != full or held.rank in survivor_rank.values():
                return None
            survivor_rank[index] = held.rank
        elif info.spare_bytes > 0:
            spares.append(index)
        else:
            return None  # a fresh engine holding nothing: the planner re-plans
    if full is None or not spares:
        return None
    lost = [rank for rank in range(len(full[0])) if rank not in survivor_rank.values()]
    if len(lost) != len(spares):
        return None
    rank_of = {**survivor_rank, **dict(zip(spares, lost, strict=True))}
    return [[list(layer[rank_of[index]]) for index in range(len(infos))] for layer in full]
