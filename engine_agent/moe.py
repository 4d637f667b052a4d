"""The reference MoE layer: deterministic weights, the single-process forward, and the distributed
step math one EP rank runs.

Every weight comes from (seed, stream, index) through a CPU `torch.Generator`, so any engine can
recompute any expert ("load it from the checkpoint") and tests can check outputs exactly. One logical
expert's weights are packed into one contiguous 1-D buffer (gate, up, down), so moving an expert is
moving one row of bytes.

Gating: softmax over the router logits, top-k, the k weights renormalised to sum to 1. Expert MLP:
SiLU-gated, `down(silu(gate(x)) * up(x))`.

Layers: `num_moe_layers` MoE layers applied one after the other, each with its own router and experts.
An expert is named across layers by its *flat id*, `layer * num_logical_experts + expert`: weights
dictionaries and transfers use it, so layer 0's ids are the logical ids.

Stacks: a rank holds each layer's experts as the rows of one buffer (`ExpertStack`), each expert's
packed buffer a view of its row. Moving an expert is still moving one row; and on a GPU the step runs
every expert of a layer in one grouped matmul per weight (`engine_agent.grouped`) instead of a loop of
small ones whose kernel launches cost more than their arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from engine_agent.grouped import Count, GroupedExperts, grouped_mm_available, grouped_share
from engine_agent.protocol import EngineConfig

_ROUTER_STREAM = 1
_EXPERT_STREAM = 2
_MASK64 = (1 << 64) - 1


def _mix(seed: int, stream: int, index: int) -> int:
    """A 63-bit generator seed from (seed, stream, index): splitmix64 over their combination."""
    z = (seed * 0x9E3779B97F4A7C15 + stream * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def torch_dtype(config: EngineConfig) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[config.dtype]


def expert_numel(config: EngineConfig) -> int:
    """Elements in one packed expert: gate [I, H], up [I, H], down [H, I]."""
    return 3 * config.intermediate_size * config.hidden_size


def expert_nbytes(config: EngineConfig) -> int:
    return expert_numel(config) * torch.empty((), dtype=torch_dtype(config)).element_size()


def flat_id(config: EngineConfig, layer: int, expert: int) -> int:
    """The id of logical expert `expert` of MoE layer `layer` across all layers."""
    return layer * config.num_logical_experts + expert


def router_weights(config: EngineConfig, device: torch.device | str = "cpu", layer: int = 0) -> torch.Tensor:
    """The gate of one layer, [num_logical_experts, hidden_size], in fp32 (routing is never lowered)."""
    generator = torch.Generator().manual_seed(_mix(config.seed, _ROUTER_STREAM, layer))
    weights = torch.randn(config.num_logical_experts, config.hidden_size, generator=generator)
    return (weights / math.sqrt(config.hidden_size)).to(device)


def expert_weights(config: EngineConfig, expert: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The packed 1-D buffer of the expert with flat id `expert` (see `flat_id`), recomputed from the
    seed (our "checkpoint")."""
    total = config.num_logical_experts * config.num_moe_layers
    if not 0 <= expert < total:
        raise ValueError(f"expert {expert} out of range [0, {total})")
    hidden, inter = config.hidden_size, config.intermediate_size
    generator = torch.Generator().manual_seed(_mix(config.seed, _EXPERT_STREAM, expert))
    gate_up = torch.randn(2 * inter * hidden, generator=generator) / math.sqrt(hidden)
    down = torch.randn(hidden * inter, generator=generator) / math.sqrt(inter)
    return torch.cat([gate_up, down]).to(device=device, dtype=torch_dtype(config)).contiguous()


def unpack(config: EngineConfig, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views (gate [I, H], up [I, H], down [H, I]) into one packed expert buffer."""
    hidden, inter = config.hidden_size, config.intermediate_size
    block = inter * hidden
    gate = packed[:block].view(inter, hidden)
    up = packed[block : 2 * block].view(inter, hidden)
    down = packed[2 * block : 3 * block].view(hidden, inter)
    return gate, up, down


def expert_mlp(config: EngineConfig, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    gate, up, down = unpack(config, packed)
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def route(
    config: EngineConfig, router: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-k logical expert ids [T, k], their gate weights [T, k]) for fp32 tokens [T, H]."""
    probs = torch.softmax(tokens.float() @ router.T, dim=-1)
    top_k = min(config.top_k, config.num_logical_experts)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    return experts, weights / weights.sum(dim=-1, keepdim=True)


def reference_forward(config: EngineConfig, tokens: torch.Tensor) -> torch.Tensor:
    """Every MoE layer computed in one process with every expert recomputed from the seed: the accuracy
    reference for a deployment of any size. tokens [T, H] -> outputs [T, H] (fp32)."""
    hidden = tokens.float()
    dtype = torch_dtype(config)
    for layer in range(config.num_moe_layers):
        experts, gate_weights = route(config, router_weights(config, layer=layer), hidden)
        out = torch.zeros_like(hidden)
        for expert in torch.unique(experts).tolist():
            rows, which = (experts == expert).nonzero(as_tuple=True)
            packed = expert_weights(config, flat_id(config, layer, expert))
            y = expert_mlp(config, packed, hidden[rows].to(dtype)).float()
            out.index_add_(0, rows, y * gate_weights[rows, which].unsqueeze(-1))
        hidden = out
    return hidden


@dataclass(frozen=True)
class ExpertStack:
    """One layer's experts held by a rank as the rows of one buffer [R, expert_numel]."""

    buffer: torch.Tensor
    experts: list[int]  # the logical expert of each row


def stack_buffers(
    config: EngineConfig, experts_by_layer: Mapping[int, list[int]], device: torch.device | str
) -> tuple[dict[int, torch.Tensor], dict[int, ExpertStack]]:
    """Uninitialised buffers for the experts a rank will hold: (flat id -> packed view of its row,
    layer -> its stack). Same bytes as one buffer per expert."""
    views: dict[int, torch.Tensor] = {}
    stacks: dict[int, ExpertStack] = {}
    for layer, experts in experts_by_layer.items():
        buffer = torch.empty(len(experts), expert_numel(config), dtype=torch_dtype(config), device=device)
        stacks[layer] = ExpertStack(buffer, list(experts))
        for row, expert in enumerate(experts):
            views[flat_id(config, layer, expert)] = buffer[row]
    return views, stacks


def grouped_step(setting: str, device: torch.device) -> bool:
    """Whether a step runs its experts batched (`auto`: on a GPU, where launches dominate a loop of
    small matmuls; not on CPU, where the padding to the busiest expert costs more than the loop)."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


@dataclass(frozen=True)
class ReplicaTable:
    """For each logical expert, its replicas' (rank, slot) as tensors, for vectorised replica choice."""

    counts: torch.Tensor  # [L] replicas per logical expert
    ranks: torch.Tensor  # [L, max_replicas]
    slots: torch.Tensor  # [L, max_replicas]

    @classmethod
    def build(cls, placement: list[list[int]], num_logical: int, device: torch.device | str) -> ReplicaTable:
        replicas: list[list[tuple[int, int]]] = [[] for _ in range(num_logical)]
        for rank, slots in enumerate(placement):
            for slot, expert in enumerate(slots):
                replicas[expert].append((rank, slot))
        width = max(len(r) for r in replicas)
        ranks = torch.full((num_logical, width), -1, dtype=torch.int64)
        slots_t = torch.full((num_logical, width), -1, dtype=torch.int64)
        for expert, places in enumerate(replicas):
            for i, (rank, slot) in enumerate(places):
                ranks[expert, i] = rank
                slots_t[expert, i] = slot
        counts = torch.tensor([max(len(r), 1) for r in replicas], dtype=torch.int64)
        return cls(counts.to(device), ranks.to(device), slots_t.to(device))


def grouped_experts(
    config: EngineConfig, stack: ExpertStack, placement: list[list[int]], rank: int, table: ReplicaTable
) -> GroupedExperts:
    """A layer's `stack` batched, as `rank` of `placement` holds it (an expert on two of its slots:
    both name its one row), with the replica `table` of the whole placement."""
    hidden, inter = config.hidden_size, config.intermediate_size
    buffer = stack.buffer
    rows, block = len(stack.experts), inter * hidden
    row_of = {expert: row for row, expert in enumerate(stack.experts)}
    ranks, slots = table.ranks.cpu(), table.slots.cpu()
    slot_rows = torch.tensor([row_of[e] for e in placement[rank]], dtype=torch.int64)
    pair_rows = torch.full_like(ranks, rows)
    here = ranks == rank
    pair_rows[here] = slot_rows[slots[here]]
    fast = grouped_mm_available(buffer.device, buffer.dtype, hidden, inter)
    return GroupedExperts(
        gate_up=buffer[:, : 2 * block].view(rows, 2 * inter, hidden),
        down=buffer[:, 2 * block : 3 * block].view(rows, hidden, inter),
        pair_rows=pair_rows.to(buffer.device),
        replica_counts=table.counts,
        kernel="grouped_mm" if fast else "padded",
    )


def choose_replicas(table: ReplicaTable, experts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank, slot) computing each (token, choice) pair of `experts` [T, k]: replica number (global
    token index mod replica count), the same on every rank."""
    token_index = torch.arange(experts.shape[0], device=experts.device).unsqueeze(-1).expand_as(experts)
    choice = token_index % table.counts[experts]
    return table.ranks[experts, choice], table.slots[experts, choice]


def local_contribution(
    config: EngineConfig,
    router: torch.Tensor,
    tokens: torch.Tensor,
    rank: int,
    placement: list[list[int]],
    table: ReplicaTable,
    weights: Mapping[int, torch.Tensor],
    grouped: GroupedExperts | None = None,
    *,
    valid: Count | None = None,
    capacity: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One EP rank's share of a step over the gathered batch tokens [T, H] (every rank sees the same).

    A (token, expert) pair is computed by exactly one replica of the expert (`choose_replicas`), so
    the ranks' partial outputs sum (all-reduce) to the layer's output. Returns (partial output [T, H]
    fp32, top-k expert ids [T, k] for load accounting). With `grouped`, the rank's experts run batched
    in fixed shapes with no host synchronisation (`grouped.grouped_share`: `valid` and `capacity` are
    its), else one at a time.
    """
    tokens = tokens.float()
    experts, gate_weights = route(config, router, tokens)
    if grouped is not None:
        partial = grouped_share(
            config, grouped, tokens, experts, gate_weights, valid=valid, capacity=capacity
        )
        return partial, experts
    chosen_rank, chosen_slot = choose_replicas(table, experts)
    out = torch.zeros_like(tokens)
    dtype = torch_dtype(config)
    # This rank's (token, choice) pairs once, grouped by slot with a stable sort: each slot's pairs are
    # then one contiguous range (in the order a per-slot mask would give), so the loop slices views.
    # A mask per slot cost a device sync and several kernels per expert (~64 experts: the whole step).
    mine_rows, mine_which = (chosen_rank == rank).nonzero(as_tuple=True)
    if mine_rows.numel() == 0:
        return out, experts
    mine_slots = chosen_slot[mine_rows, mine_which]
    order = torch.argsort(mine_slots, stable=True)
    mine_rows, mine_which = mine_rows[order], mine_which[order]
    slots, counts = torch.unique_consecutive(mine_slots[order], return_counts=True)
    start = 0
    for slot, count in zip(slots.tolist(), counts.tolist(), strict=True):  # ascending slots, as before
        expert = placement[rank][slot]
        rows, which = mine_rows[start : start + count], mine_which[start : start + count]
        start += count
        y = expert_mlp(config, weights[expert], tokens[rows].to(dtype)).float()
        out.index_add_(0, rows, y * gate_weights[rows, which].unsqueeze(-1))
    return out, experts


def own_load(config: EngineConfig, experts: torch.Tensor, start: Count, end: Count) -> torch.Tensor:
    """How many of the rows [start, end) of `experts` [T, k] each logical expert was routed, [L] int64,
    on the step's device (no host read: the serving loop adds it up, the API reads the sum)."""
    index = torch.arange(experts.shape[0], device=experts.device)
    own = ((index >= start) & (index < end)).unsqueeze(-1).expand_as(experts)
    load = torch.zeros(config.num_logical_experts, dtype=torch.int64, device=experts.device)
    return load.index_add_(0, experts.flatten(), own.flatten().to(torch.int64))


@dataclass(frozen=True)
class LayerView:
    """What one rank serves of one MoE layer: its router, placement, replica table and weights (by
    logical expert id)."""

    router: torch.Tensor
    placement: list[list[int]]
    table: ReplicaTable
    weights: Mapping[int, torch.Tensor]
    grouped: GroupedExperts | None = None  # the batched form of `weights`, where the step uses it


def layer_views(
    config: EngineConfig,
    placements: list[list[list[int]]],
    weights: Mapping[int, torch.Tensor],
    routers: list[torch.Tensor],
    device: torch.device | str,
    *,
    rank: int | None = None,
    stacks: Mapping[int, ExpertStack] | None = None,
) -> list[LayerView]:
    """One view per layer over the flat-id weights a rank holds; with the rank and its stacks, each
    view also carries the batched form of its experts (`GroupedExperts`)."""
    views = []
    for layer, placement in enumerate(placements):
        base = flat_id(config, layer, 0)
        mine = {
            flat - base: tensor
            for flat, tensor in weights.items()
            if base <= flat < base + config.num_logical_experts
        }
        table = ReplicaTable.build(placement, config.num_logical_experts, device)
        stack = (stacks or {}).get(layer)
        grouped = None
        if stack is not None and rank is not None and placement[rank]:
            grouped = grouped_experts(config, stack, placement, rank, table)
        views.append(LayerView(routers[layer], placement, table, mine, grouped))
    return views
