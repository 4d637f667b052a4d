"""Which engines can form a generation together: the largest set in which every pair reaches each other
on the data network (pure).

Each engine reports the peers whose data address did not accept its connection (`data_unreachable` in
its heartbeat). Two engines can be in one group only if neither reports the other: a collective needs
every pair. A broken data link on one host leaves that host's engines outside the largest such set,
which is what self-healing re-forms the generation on (`heal`); the others are fenced
until their network comes back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def largest_reachable_set(engines: Sequence[str], unreachable: Mapping[str, Sequence[str]]) -> list[str]:
    """The largest subset of `engines` in which no engine reports another as unreachable, in the order
    given; among sets of that size, the one whose members come first in that order (the current ranks
    first, so the group keeps who it can)."""
    cannot = {e: set(unreachable.get(e, ())) for e in engines}
    apart = {a: {b for b in engines if b != a and (b in cannot[a] or a in cannot[b])} for a in engines}
    if not any(apart.values()):
        return list(engines)
    order = {e: i for i, e in enumerate(engines)}
    best: list[str] = []

    def extend(chosen: list[str], candidates: list[str]) -> None:
        nonlocal best
        if len(chosen) + len(candidates) <= len(best):
            return  # cannot beat what was found
        if not candidates:
            key = [order[e] for e in chosen]
            if len(chosen) > len(best) or key < [order[e] for e in best]:
                best = list(chosen)
            return
        first, rest = candidates[0], candidates[1:]
        extend([*chosen, first], [c for c in rest if c not in apart[first]])  # with it
        if apart[first]:  # without it (only worth trying when it excludes someone)
            extend(chosen, rest)

    extend([], list(engines))
    return best
