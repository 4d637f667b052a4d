"""Coverage: whether every logical expert of every layer survives the loss of any one engine, and of
any one failure domain (a host) where engines share one.

An expert is covered when its replicas sit in at least two units, a unit being a failure domain where
the engines span two or more of them, else an engine (one host: only engine losses can be survived,
and a host-level loss takes every engine). Covered at the domain level implies covered at the engine
level.

- `coverage_of(placement, domains)`: the measured property, per layer and per engine and domain.
- `layer_cover.cover(...)`: the placement goal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine_agent.layer_fresh import BoolArray, IntArray, held_pairs


def units_of(domains: Sequence[str] | None, world: int) -> tuple[IntArray, bool]:
    """(unit index per rank, whether units are domains): domains when the ranks span two or more,
    else one unit per rank."""
    if domains is not None:
        if len(domains) != world:
            raise ValueError(f"domains has {len(domains)} entries for {world} ranks")
        names = sorted(set(domains))
        if len(names) >= 2:
            return np.array([names.index(d) for d in domains], dtype=np.int64), True
    return np.arange(world, dtype=np.int64), False


@dataclass(frozen=True)
class Coverage:
    """Experts whose loss one failure would cause, per layer and where they sit."""

    layers: int
    experts: int  # logical experts per layer
    engines: int
    domains: tuple[str, ...]  # the distinct failure domains, sorted
    single_engine: IntArray  # [layer]: experts held by one engine only
    single_domain: IntArray | None  # [layer]: experts held in one domain only (None: one domain)
    by_engine: IntArray  # [rank]: (layer, expert) pairs that only this rank holds
    by_domain: dict[str, int]  # domain -> (layer, expert) pairs held only there (two domains or more)
    examples: tuple[tuple[int, int, int], ...]  # a few (layer, expert, rank) held by one engine only

    @property
    def at_risk_engine(self) -> int:
        return int(self.single_engine.sum())

    @property
    def at_risk_domain(self) -> int | None:
        return None if self.single_domain is None else int(self.single_domain.sum())

    @property
    def covered(self) -> bool:
        """No single engine loss (nor domain loss, with two domains or more) leaves an expert unserved."""
        return self.at_risk_engine == 0 and not self.at_risk_domain

    def record(self, engine_ids: Sequence[str], domain_of: Sequence[str]) -> dict[str, object]:
        """JSON for the job and the deployment: counts, and where the single replicas sit."""
        return {
            "covered": self.covered,
            "domain_key": "data_host",
            "layers": self.layers,
            "experts": self.experts,
            "engines": self.engines,
            "domains": len(self.domains),
            "at_risk": self.at_risk_engine,
            "at_risk_domain": self.at_risk_domain,
            "per_layer": [int(n) for n in self.single_engine],
            "per_layer_domain": None if self.single_domain is None else [int(n) for n in self.single_domain],
            "by_engine": {
                engine_ids[rank]: int(n)
                for rank, n in enumerate(self.by_engine)
                if n and rank < len(engine_ids)
            },
            "by_domain": dict(self.by_domain),
            "examples": [
                {"layer": layer, "expert": expert, "engine": engine_ids[rank], "domain": domain_of[rank]}
                for layer, expert, rank in self.examples
                if rank < len(engine_ids)
            ],
        }


def coverage_of(placement: IntArray, num_logical: int, domains: Sequence[str] | None = None) -> Coverage:
    """The coverage of `placement[layer, rank, slot]` with `domains[rank]` (None: one per engine)."""
    num_layers, world, _ = placement.shape
    held = held_pairs(placement, num_logical)
    holders = held.sum(axis=1)  # [layer, expert]
    single = holders == 1
    layer, expert = np.nonzero(single)
    rank = held[layer, :, expert].argmax(axis=1) if layer.size else np.zeros(0, dtype=np.int64)
    by_engine = np.bincount(rank, minlength=world)
    names = tuple(sorted(set(domains))) if domains is not None else ()
    single_domain: IntArray | None = None
    by_domain: dict[str, int] = {}
    if len(names) >= 2 and domains is not None:
        unit, _ = units_of(domains, world)
        span = _spans(held, unit, len(names))
        lone = span == 1
        single_domain = lone.sum(axis=1)
        dl, de = np.nonzero(lone)
        if dl.size:
            where = unit[held[dl, :, de].argmax(axis=1)]
            counted = np.bincount(where, minlength=len(names))
            by_domain = {names[i]: int(n) for i, n in enumerate(counted) if n}
    examples = tuple(
        (int(a), int(b), int(c)) for a, b, c in zip(layer[:5], expert[:5], rank[:5], strict=True)
    )
    return Coverage(
        layers=num_layers,
        experts=num_logical,
        engines=world,
        domains=names,
        single_engine=single.sum(axis=1),
        single_domain=single_domain,
        by_engine=by_engine,
        by_domain=by_domain,
        examples=examples,
    )


def uncovered(placement: IntArray, num_logical: int, unit: IntArray) -> IntArray:
    """[layer]: experts whose replicas sit in fewer than two units."""
    held = held_pairs(placement, num_logical)
    return (_spans(held, unit, int(unit.max(initial=0)) + 1) < 2).sum(axis=1)


def _spans(held: BoolArray, unit: IntArray, units: int) -> IntArray:
    """[layer, expert]: how many units hold a replica."""
    if units == unit.size:  # one engine per unit: the holders
        return held.sum(axis=1)
    return (per_unit_counts(held, unit, units) > 0).sum(axis=1)


UnitCounts = npt.NDArray[np.int16]


def per_unit_counts(held: BoolArray, unit: IntArray, units: int) -> UnitCounts:
    """[layer, unit, expert]: replicas held in each unit (int16: at most the unit's ranks each, and a
    quarter of the memory traffic of int64 on these [layer, rank, expert] tables)."""
    if units == unit.size:  # one engine per unit
        return held.astype(np.int16)
    per_unit = np.zeros((held.shape[0], units, held.shape[2]), dtype=np.int16)
    for index in range(units):
        per_unit[:, index] = held[:, unit == index].sum(axis=1)
    return per_unit
