"""The reference MoE layer: deterministic weights, and the distributed step math summing to the
single-process forward for any placement (replicas included)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine_agent import moe
from engine_agent.grouped import Kernel
from engine_agent.placement import rebalance, round_robin
from engine_agent.protocol import EngineConfig

CONFIG = EngineConfig(
    num_logical_experts=8, num_redundant_experts=3, hidden_size=16, intermediate_size=24, top_k=3
)


def test_expert_weights_are_recomputed_identically_from_the_seed() -> None:
    assert torch.equal(moe.expert_weights(CONFIG, 5), moe.expert_weights(CONFIG, 5))
    assert not torch.equal(moe.expert_weights(CONFIG, 5), moe.expert_weights(CONFIG, 6))
    other_seed = CONFIG.model_copy(update={"seed": 1})
    assert not torch.equal(moe.expert_weights(CONFIG, 5), moe.expert_weights(other_seed, 5))


def test_an_expert_is_one_contiguous_flat_buffer_of_gate_up_and_down() -> None:
    packed = moe.expert_weights(CONFIG, 0)
    assert packed.ndim == 1 and packed.is_contiguous()
    assert packed.numel() == moe.expert_numel(CONFIG) == 3 * 16 * 24
    assert moe.expert_nbytes(CONFIG) == packed.numel() * 4
    gate, up, down = moe.unpack(CONFIG, packed)
    assert gate.shape == (24, 16) and up.shape == (24, 16) and down.shape == (16, 24)


def test_gate_weights_of_each_token_sum_to_one() -> None:
    tokens = torch.randn(10, CONFIG.hidden_size)
    experts, weights = moe.route(CONFIG, moe.router_weights(CONFIG), tokens)
    assert experts.shape == (10, 3)
    torch.testing.assert_close(weights.sum(-1), torch.ones(10))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["balanced", "round_robin"])
def test_ranks_partial_outputs_sum_to_the_reference_forward(world_size: int, layout: str) -> None:
    if layout == "balanced":
        placement = rebalance([9, 1, 1, 1, 1, 1, 1, 5], CONFIG.num_redundant_experts, world_size)
    else:
        placement = round_robin(CONFIG.num_logical_experts, CONFIG.num_redundant_experts, world_size)
    tokens = torch.randn(37, CONFIG.hidden_size)
    table = moe.ReplicaTable.build(placement, CONFIG.num_logical_experts, "cpu")
    router = moe.router_weights(CONFIG)
    total = torch.zeros_like(tokens)
    for rank, slots in enumerate(placement):
        weights = {e: moe.expert_weights(CONFIG, e) for e in set(slots)}
        partial, _ = moe.local_contribution(CONFIG, router, tokens, rank, placement, table, weights)
        total += partial
    reference = moe.reference_forward(CONFIG, tokens)
    assert float((total - reference).norm() / reference.norm()) < 1e-5


def test_each_token_expert_pair_is_computed_by_exactly_one_replica() -> None:
    placement = [[0, 1, 2, 3], [0, 4, 5, 6], [0, 7, 1, 2]]  # expert 0 on every rank
    tokens = torch.randn(30, CONFIG.hidden_size)
    table = moe.ReplicaTable.build(placement, CONFIG.num_logical_experts, "cpu")
    router = moe.router_weights(CONFIG)
    only_zero = {
        e: (moe.expert_weights(CONFIG, e) if e == 0 else torch.zeros(moe.expert_numel(CONFIG)))
        for e in range(CONFIG.num_logical_experts)
    }
    rows_per_rank = []
    for rank in range(3):
        partial, _ = moe.local_contribution(CONFIG, router, tokens, rank, placement, table, only_zero)
        rows_per_rank.append(set(partial.abs().sum(-1).nonzero().flatten().tolist()))
    assert not (rows_per_rank[0] & rows_per_rank[1]) and not (rows_per_rank[1] & rows_per_rank[2])
    assert not (rows_per_rank[0] & rows_per_rank[2])
    assert sum(len(r) for r in rows_per_rank) > 0


def stacked(rank: int, placement: list[list[int]]) -> tuple[dict[int, torch.Tensor], moe.GroupedExperts]:
    """The rank's experts as the engine holds them: views of one stack, filled from the seed."""
    views, stacks = moe.stack_buffers(CONFIG, {0: sorted(set(placement[rank]))}, "cpu")
    for expert, view in views.items():
        view.copy_(moe.expert_weights(CONFIG, expert))
    table = moe.ReplicaTable.build(placement, CONFIG.num_logical_experts, "cpu")
    return views, moe.grouped_experts(CONFIG, stacks[0], placement, rank, table)


def test_stacked_buffers_are_views_of_one_row_each() -> None:
    views, stacks = moe.stack_buffers(CONFIG, {0: [1, 4], 1: [0]}, "cpu")
    assert sorted(views) == [1, 4, moe.flat_id(CONFIG, 1, 0)]
    assert stacks[0].buffer.shape == (2, moe.expert_numel(CONFIG)) and stacks[0].experts == [1, 4]
    views[4].fill_(3.0)
    assert torch.equal(stacks[0].buffer[1], torch.full((moe.expert_numel(CONFIG),), 3.0))
    assert all(v.is_contiguous() and v.ndim == 1 for v in views.values())


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("tokens_count", [1, 5, 37])
@pytest.mark.parametrize(
    ("kernel", "capacity"), [("grouped_mm", None), ("padded", None), ("padded", 37), ("direct", None)]
)
def test_the_grouped_step_sums_to_the_same_output_as_the_per_expert_loop(
    world_size: int, tokens_count: int, kernel: Kernel, capacity: int | None
) -> None:
    """The GPU's batched form of a rank's share (a grouped matmul over the sorted pairs, or two bmm over
    a padded buffer of the busiest expert's or a fixed capacity) against the loop, on CPU; a placement
    with an expert twice on one rank, and ranks that get no pair at all."""
    placement = rebalance([9, 1, 1, 1, 1, 1, 1, 5], CONFIG.num_redundant_experts, world_size)
    if world_size == 1:
        placement = [placement[0] + [0]]  # expert 0 on two slots of the one rank
    tokens = torch.randn(tokens_count, CONFIG.hidden_size)
    table = moe.ReplicaTable.build(placement, CONFIG.num_logical_experts, "cpu")
    router = moe.router_weights(CONFIG)
    total = torch.zeros_like(tokens)
    for rank in range(world_size):
        views, grouped = stacked(rank, placement)
        grouped = dataclasses.replace(grouped, kernel=kernel)
        loop, experts = moe.local_contribution(CONFIG, router, tokens, rank, placement, table, views)
        batched, same = moe.local_contribution(
            CONFIG, router, tokens, rank, placement, table, views, grouped, capacity=capacity
        )
        torch.testing.assert_close(batched, loop, rtol=1e-5, atol=1e-6)
        assert torch.equal(experts, same)
        total += batched
    reference = moe.reference_forward(CONFIG, tokens)
    assert float((total - reference).norm() / reference.norm()) < 1e-5
