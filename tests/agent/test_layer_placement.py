"""Per-layer placement planned from the previous one: valid, balanced like a fresh rebalance, few copies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_agent.layer_fresh import held_pairs
from engine_agent.layer_placement import (
    COVERAGE_BALANCE,
    copies_lower_bound,
    copies_moved,
    layer_balance,
    normalized_loads,
    origin_held,
    rebalance_layers,
    replica_counts,
)
from engine_agent.placement import plan_transfers, rebalance, slots_per_rank, validate_placement


def skewed(layers: int, experts: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    profile = 1000.0 / np.arange(1, experts + 1)
    return np.stack([rng.permutation(profile) * rng.uniform(0.8, 1.2, experts) for _ in range(layers)])


def python_balance(loads: np.ndarray, redundant: int, world: int) -> np.ndarray:
    fresh = np.array([rebalance(layer.tolist(), redundant, world) for layer in loads])
    return layer_balance(fresh, normalized_loads(loads))


def test_a_fresh_plan_places_every_expert_of_every_layer_and_balances_like_the_per_layer_rebalance() -> None:
    loads = skewed(6, 32)
    plan = rebalance_layers(loads, 8, 5, coverage=False)
    assert plan.placement.shape == (6, 5, slots_per_rank(32, 8, 5))
    for layer in plan.to_lists():
        validate_placement(layer, 32)
    np.testing.assert_allclose(plan.balance, python_balance(loads, 8, 5), rtol=1e-9)


def test_without_a_previous_placement_every_copy_comes_from_the_checkpoint() -> None:
    plan = rebalance_layers(skewed(2, 16), 4, 4)
    assert plan.copies_moved == plan.lower_bound == 2 * 4 * slots_per_rank(16, 4, 4)


def test_an_unchanged_deployment_moves_nothing() -> None:
    loads = skewed(4, 32)
    first = rebalance_layers(loads, 8, 4)
    again = rebalance_layers(loads, 8, 4, previous=first.placement)
    assert again.copies_moved == 0
    np.testing.assert_array_equal(again.placement, first.placement)


def test_each_layer_gets_its_own_placement() -> None:
    plan = rebalance_layers(skewed(3, 16), 4, 4)
    assert len({layer.tobytes() for layer in plan.placement}) == 3


@pytest.mark.parametrize("coverage", [False, True])
@pytest.mark.parametrize("world", [9, 7])
def test_one_rank_more_or_fewer_moves_few_copies_and_keeps_the_balance(world: int, coverage: bool) -> None:
    loads = skewed(8, 64, seed=3)
    start = rebalance_layers(loads, 8, 8, coverage=coverage)
    origin = None if world > 8 else [0, 1, 2, 4, 5, 6, 7]  # rank 3 leaves
    plan = rebalance_layers(loads, 8, world, previous=start.placement, origin=origin, coverage=coverage)
    bound = 0.98 * (COVERAGE_BALANCE if coverage else 1.0)
    assert (plan.balance >= bound * python_balance(loads, 8, world) - 1e-12).all()
    pairs = int(sum(len(set(slots)) for layer in plan.to_lists() for slots in layer))
    assert plan.copies_moved < 0.25 * pairs, "a fresh placement re-sends ~90% of the pairs"


def test_copies_are_the_transfer_plan_items() -> None:
    loads = skewed(2, 16, seed=1)
    start = rebalance_layers(loads, 4, 4)
    old_members = ["a", "b", "c", "d"]
    new_members = ["a", "c", "d"]  # b leaves: new ranks come from old ranks 0, 2, 3
    plan = rebalance_layers(loads, 4, 3, previous=start.placement, origin=[0, 2, 3])
    items = sum(
        len(plan_transfers(old_members, start.to_lists()[layer], new_members, plan.to_lists()[layer]))
        for layer in range(2)
    )
    assert items == plan.copies_moved


def test_the_lower_bound_counts_joiner_slots_and_replicas_nobody_keeps() -> None:
    kept = origin_held(np.array([[[0, 1], [2, 3]]]), [0, 1, None], 4)
    counts = np.array([[2, 2, 1, 1]])
    # experts 0 and 1 need one more replica each; the joiner needs two slots filled: both say 2.
    assert copies_lower_bound(counts, kept, 2) == 2
    assert copies_moved(np.array([[[0, 1], [2, 3], [0, 1]]]), kept) == 2


def test_replica_counts_go_to_the_highest_load_per_replica() -> None:
    counts = replica_counts(np.array([[10.0, 3.0, 1.0, 1.0]]), 6, 3)
    assert counts.tolist() == [[3, 1, 1, 1]]


@pytest.mark.parametrize(
    ("load", "problem"),
    [
        ([[1.0, -1.0]], "invalid load"),
        ([[1.0, float("nan")]], "invalid load"),
        ([[[1.0]]], "layers, experts"),
    ],
)
def test_bad_loads_are_refused(load: list[list[float]], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        rebalance_layers(load, 0, 1)


def test_a_previous_placement_of_another_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="previous placement"):
        rebalance_layers(skewed(2, 8), 0, 2, previous=np.zeros((3, 2, 4), dtype=np.int64))


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(min_value=1, max_value=3),
    experts=st.integers(min_value=1, max_value=24),
    redundant=st.integers(min_value=0, max_value=6),
    old_world=st.integers(min_value=1, max_value=6),
    new_world=st.integers(min_value=1, max_value=6),
    seed=st.integers(min_value=0, max_value=1000),
    coverage=st.booleans(),
    hosts=st.integers(min_value=1, max_value=3),
)
def test_any_change_gives_a_valid_placement_balanced_within_the_bound(
    layers: int,
    experts: int,
    redundant: int,
    old_world: int,
    new_world: int,
    seed: int,
    coverage: bool,
    hosts: int,
) -> None:
    rng = np.random.default_rng(seed)
    old_loads = rng.exponential(size=(layers, experts)) * (rng.random((layers, experts)) > 0.2)
    new_loads = old_loads * rng.uniform(0.5, 1.5, size=old_loads.shape)
    start = rebalance_layers(old_loads, redundant, old_world, coverage=coverage)
    origin = list(rng.permutation(old_world)[:new_world]) + [None] * max(0, new_world - old_world)
    domains = [f"host-{rank % hosts}" for rank in range(new_world)]
    kwargs = {
        "previous": start.placement,
        "origin": [None if o is None else int(o) for o in origin],
        "coverage": coverage,
        "domains": domains,
    }
    plan = rebalance_layers(new_loads, redundant, new_world, **kwargs)  # type: ignore[arg-type]
    for layer in plan.to_lists():
        validate_placement(layer, experts)
        assert all(len(slots) == slots_per_rank(experts, redundant, new_world) for slots in layer)
    bound = 0.98 * (COVERAGE_BALANCE if coverage else 1.0)
    assert (plan.balance >= bound * plan.fresh_balance - 1e-9).all()
    assert plan.coverage is not None
    assert plan.coverage.at_risk_engine == int((held_pairs(plan.placement, experts).sum(axis=1) == 1).sum())
    again = rebalance_layers(new_loads, redundant, new_world, **kwargs)  # type: ignore[arg-type]
    np.testing.assert_array_equal(plan.placement, again.placement)
