"""Expert placement and the transfer plan: validity, balance on skewed loads, determinism."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_agent.placement import (
    TransferItem,
    balance_ratio,
    plan_transfers,
    rank_loads,
    rebalance,
    replica_map,
    round_robin,
    slots_per_rank,
    validate_placement,
)


def zipf_load(num_logical: int, exponent: float = 1.2) -> list[float]:
    return [1000.0 / (rank + 1) ** exponent for rank in range(num_logical)]


def apply_plan(
    old_members: list[str], old_placement: list[list[int]], plan: list[TransferItem]
) -> dict[str, set[int]]:
    """What each engine holds once every item has moved (sources must hold what they send)."""
    held = {engine: set(slots) for engine, slots in zip(old_members, old_placement, strict=True)}
    original = {engine: set(experts) for engine, experts in held.items()}
    for item in plan:
        if item.src is not None:
            assert item.logical_expert in original[item.src], f"{item.src} never held {item}"
        held.setdefault(item.dst, set()).add(item.logical_expert)
    return held


def test_slots_per_rank_is_the_ceiling_of_slots_over_ranks() -> None:
    assert slots_per_rank(16, 0, 4) == 4
    assert slots_per_rank(16, 2, 4) == 5
    assert slots_per_rank(16, 0, 3) == 6


def test_rebalance_places_every_logical_expert_and_keeps_the_slot_count() -> None:
    placement = rebalance(zipf_load(16), num_redundant=4, world_size=3)
    validate_placement(placement, 16)
    assert len(placement) == 3
    assert all(len(slots) == slots_per_rank(16, 4, 3) for slots in placement)


def test_slots_beyond_the_requested_redundancy_become_extra_replicas_of_hot_experts() -> None:
    placement = rebalance(zipf_load(16), num_redundant=0, world_size=3)  # 18 slots for 16 experts
    counts = {e: len(r) for e, r in replica_map(placement).items()}
    assert sum(counts.values()) == 18
    assert all(counts[e] == 1 for e in range(2, 16))


def test_redundant_replicas_go_to_the_hottest_experts() -> None:
    placement = rebalance(zipf_load(16), num_redundant=4, world_size=4)
    counts = [len(r) for r in replica_map(placement).values()]
    assert counts[0] > 1
    assert counts == sorted(counts, reverse=True), "a hotter expert never has fewer replicas"


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_rebalance_balances_a_zipf_load_better_than_round_robin(world_size: int) -> None:
    load = zipf_load(32)
    balanced = balance_ratio(rebalance(load, 8, world_size), load)
    naive = balance_ratio(round_robin(32, 8, world_size), load)
    assert balanced < naive
    assert balanced - 1.0 < (naive - 1.0) / 3


def test_zero_load_is_placed_as_uniform_load() -> None:
    assert rebalance([0.0] * 8, 0, 4) == rebalance([1.0] * 8, 0, 4)


def test_empty_load_is_uniform_over_the_given_number_of_experts() -> None:
    assert rebalance([], 2, 3, num_logical=8) == rebalance([1.0] * 8, 2, 3)


def test_empty_load_without_an_expert_count_is_refused() -> None:
    with pytest.raises(ValueError, match="num_logical"):
        rebalance([], 0, 2)


def test_rebalance_is_deterministic() -> None:
    load = [5.0, 5.0, 1.0, 1.0, 3.0, 3.0, 0.0, 2.0]
    assert rebalance(load, 3, 3) == rebalance(list(load), 3, 3)


def test_rank_loads_split_an_experts_load_across_its_replicas() -> None:
    assert rank_loads([[0, 1], [0, 2]], [10.0, 3.0, 1.0]) == [8.0, 6.0]
    assert balance_ratio([[0, 1], [0, 2]], [10.0, 3.0, 1.0]) == pytest.approx(8.0 / 7.0)


@pytest.mark.parametrize(
    ("placement", "problem"),
    [
        ([], "no ranks"),
        ([[0, 1], [2]], "rank 1 has 1 slots"),
        ([[0, 1], [2, 9]], "rank 1 slot 1 holds 9"),
        ([[0, 1], [1, 0]], r"placed nowhere: \[2\]"),
    ],
)
def test_validate_placement_names_the_problem(placement: list[list[int]], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        validate_placement(placement, 3)


def test_replica_map_lists_replicas_in_rank_and_slot_order() -> None:
    assert replica_map([[1, 0], [0, 2]]) == {0: [(0, 1), (1, 0)], 1: [(0, 0)], 2: [(1, 1)]}


@settings(max_examples=150, deadline=None)
@given(
    load=st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=40),
    num_redundant=st.integers(min_value=0, max_value=16),
    world_size=st.integers(min_value=1, max_value=9),
)
def test_rebalance_is_always_valid_and_never_doubles_up_when_avoidable(
    load: list[float], num_redundant: int, world_size: int
) -> None:
    placement = rebalance(load, num_redundant, world_size)
    validate_placement(placement, len(load))
    per_rank = slots_per_rank(len(load), num_redundant, world_size)
    assert [len(slots) for slots in placement] == [per_rank] * world_size
    counts = {e: len(r) for e, r in replica_map(placement).items()}
    for expert, replicas in replica_map(placement).items():
        ranks = [rank for rank, _ in replicas]
        if counts[expert] <= world_size:
            assert len(set(ranks)) == len(ranks), f"expert {expert} twice on one rank: {placement}"
    assert placement == rebalance(list(load), num_redundant, world_size)


@settings(max_examples=100, deadline=None)
@given(
    load=st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=24),
    old_world=st.integers(min_value=1, max_value=5),
    new_world=st.integers(min_value=1, max_value=5),
    num_redundant=st.integers(min_value=0, max_value=6),
    shift=st.integers(min_value=0, max_value=4),
)
def test_applying_the_plan_gives_every_new_rank_its_experts(
    load: list[float], old_world: int, new_world: int, num_redundant: int, shift: int
) -> None:
    engines = [f"e{i}" for i in range(10)]
    old_members = engines[:old_world]
    new_members = engines[shift : shift + new_world]  # some stay, some leave, some join
    old_placement = rebalance(load, num_redundant, old_world)
    new_placement = rebalance(list(reversed(load)), num_redundant, new_world)
    plan = plan_transfers(old_members, old_placement, new_members, new_placement)

    held = apply_plan(old_members, old_placement, plan)
    for engine, slots in zip(new_members, new_placement, strict=True):
        assert set(slots) <= held[engine]
    keys = [(item.dst, item.logical_expert) for item in plan]
    assert len(keys) == len(set(keys)), "one item per (dst, expert)"
    assert all(item.src is not None for item in plan), "every expert had an old holder"
    assert plan == sorted(plan, key=lambda item: (item.logical_expert, item.dst))
    assert plan == plan_transfers(old_members, old_placement, new_members, new_placement)


def test_an_engine_never_receives_an_expert_it_already_holds() -> None:
    plan = plan_transfers(["a", "b"], [[0, 1], [2, 3]], ["a", "b", "c"], [[0, 1], [2, 3], [0, 2]])
    assert plan == [TransferItem(0, "a", "c"), TransferItem(2, "b", "c")]


def test_a_leaver_is_the_source_when_it_is_the_only_holder() -> None:
    plan = plan_transfers(["a", "b", "c"], [[0, 1], [2, 3], [4, 5]], ["a", "b"], [[0, 1, 4], [2, 3, 5]])
    assert plan == [TransferItem(4, "c", "a"), TransferItem(5, "c", "b")]


def test_engines_that_stay_are_preferred_as_sources_over_leavers() -> None:
    plan = plan_transfers(["a", "b"], [[0, 1], [0, 1]], ["a", "c"], [[0, 1], [0, 1]])
    assert {item.src for item in plan} == {"a"}


def test_sources_are_spread_across_holders() -> None:
    plan = plan_transfers(
        ["a", "b"], [[0, 1], [0, 1]], ["a", "b", "c", "d"], [[0, 1], [0, 1], [0, 1], [0, 1]]
    )
    sources = [item.src for item in plan]
    assert sources.count("a") == sources.count("b") == 2


def test_experts_nobody_holds_come_from_the_checkpoint() -> None:
    plan = plan_transfers([], [], ["a", "b"], [[0, 1], [2, 3]])
    assert plan == [TransferItem(e, None, dst) for e, dst in [(0, "a"), (1, "a"), (2, "b"), (3, "b")]]


def test_plan_refuses_members_that_do_not_match_the_placement() -> None:
    with pytest.raises(ValueError, match="2 ranks for 3 members"):
        plan_transfers(["a", "b", "c"], [[0], [1]], ["a"], [[0, 1]])
