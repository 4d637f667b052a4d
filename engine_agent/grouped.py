"""One rank's share of a MoE layer as a few tensor ops of fixed shapes: the batched step.

Every (token, choice) pair of the step is one row of a sorted list: a rank's own pairs first, sorted
by the stack row of the expert they go to, then every other pair (another rank's, or a padding
token's). The experts then run over those rows in one grouped matmul per weight (`torch._grouped_mm`,
whose groups are the rows' ranges; rows past the last group are not computed), or, where that kernel
is missing, in two batched matmuls over a buffer padded to a fixed capacity per expert. Nothing reads
a tensor's value on the host: no device synchronisation and no shape that depends on the routing, so
the same ops can be captured once as a CUDA graph per token count and replayed (`step_graphs`).

For a few tokens the sort and its bookkeeping cost more than the experts (a 1-token step on an H100:
~30 small kernels around two grouped matmuls). The `direct` kernel skips them: each (token, choice) pair
runs its expert's rows directly and each token sums its own k choices, no sort and no scatter. Here it
is torch ops over the gathered rows (the CPU's form, the tests' check); on CUDA the step runs it as
three fused Triton kernels, routing included (`direct_triton`).

`valid` and `own` may be host numbers (the eager step) or 0-dim device tensors (a captured graph,
whose padded tokens past `valid` must count for nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from engine_agent.protocol import EngineConfig

Kernel = Literal["grouped_mm", "padded", "direct"]
Count = int | torch.Tensor  # a host number, or a 0-dim int64 tensor on the step's device


def grouped_mm_available(device: torch.device, dtype: torch.dtype, hidden: int, inter: int) -> bool:
    """Whether `torch._grouped_mm` runs here without reading its group offsets on the host: on CPU
    (where reading them costs nothing), and on CUDA only in bf16 on Hopper/Blackwell (the CUTLASS
    kernel; other CUDA cases fall back to a loop over `offs.cpu()`, a synchronisation per call)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cpu":
        return True
    if device.type != "cuda" or torch.version.hip is not None or dtype != torch.bfloat16:
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major in (9, 10) and hidden % 16 == 0 and inter % 16 == 0


@dataclass(frozen=True)
class GroupedExperts:
    """A layer's stack as batched matrices, and where each (expert, replica) pair of the step goes:
    `pair_rows[e, i]` is the stack row holding replica i of logical expert e when that replica is
    this rank's, else R (not this rank's pair)."""

    gate_up: torch.Tensor  # [R, 2I, H]
    down: torch.Tensor  # [R, H, I]
    pair_rows: torch.Tensor  # [L, max replicas] int64
    replica_counts: torch.Tensor  # [L] int64: replicas per logical expert (>= 1)
    kernel: Kernel = "padded"

    @property
    def rows(self) -> int:
        return int(self.gate_up.shape[0])

    def pair_keys(self, experts: torch.Tensor) -> torch.Tensor:
        """For the top-k choices `experts` [T, k]: the stack row computing each pair here, or R. The
        replica is number (token index mod replica count), the same choice on every rank."""
        token_index = torch.arange(experts.shape[0], device=experts.device).unsqueeze(-1)
        return self.pair_rows[experts, token_index % self.replica_counts[experts]]


def grouped_share(
    config: EngineConfig,
    grouped: GroupedExperts,
    tokens: torch.Tensor,
    experts: torch.Tensor,
    gate_weights: torch.Tensor,
    *,
    valid: Count | None = None,
    capacity: int | None = None,
) -> torch.Tensor:
    """This rank's partial output [T, H] fp32 over the routed step: its pairs through its experts,
    each times its gate weight. `valid`: tokens past it are padding (no pair of theirs is this
    rank's). `capacity`: the padded kernel's rows per expert; None reads the busiest expert's count
    on the host (the eager step past the largest graph, where a fixed capacity would waste most)."""
    count, top_k = experts.shape
    rows = grouped.rows
    key = grouped.pair_keys(experts)
    if valid is not None:
        padding = torch.arange(count, device=tokens.device) >= valid
        key = key.masked_fill(padding.unsqueeze(-1), rows)
    if grouped.kernel == "direct":
        return _direct_experts(config, grouped, tokens, key, gate_weights)
    key = key.flatten()
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    pair_token = order // top_k
    is_mine = sorted_key < rows
    bounds = torch.arange(rows + 1, device=tokens.device)
    starts = torch.searchsorted(sorted_key, bounds)  # first pair of each row (rows: "not mine")
    dtype = grouped.gate_up.dtype
    x = tokens[pair_token].to(dtype)
    inter = config.intermediate_size
    if grouped.kernel == "grouped_mm":
        ends = starts[1:].to(torch.int32)  # groups' end offsets; pairs past the last are not computed
        h = torch._grouped_mm(x, grouped.gate_up.transpose(1, 2), offs=ends)
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = torch._grouped_mm(act, grouped.down.transpose(1, 2), offs=ends)
    else:
        y = _padded_experts(grouped, x, sorted_key, starts, is_mine, capacity, inter)
    weight = gate_weights.flatten()[order]
    contribution = torch.where(is_mine.unsqueeze(-1), y.float() * weight.unsqueeze(-1), 0.0)
    return torch.zeros_like(tokens).index_add_(0, pair_token, contribution)


def _padded_experts(
    grouped: GroupedExperts,
    x: torch.Tensor,
    sorted_key: torch.Tensor,
    starts: torch.Tensor,
    is_mine: torch.Tensor,
    capacity: int | None,
    inter: int,
) -> torch.Tensor:
    """The experts as two bmm over [R, capacity, H]: each of the rank's pairs at its position within
    its expert's range, every other pair into one spare row that nothing reads."""
    rows, pairs = grouped.rows, x.shape[0]
    if capacity is None:
        capacity = max(1, int((starts[1:] - starts[:-1]).max()))  # host read: the eager path only
    position = torch.arange(pairs, device=x.device) - starts[sorted_key]
    spare = rows * capacity
    slot = torch.where(is_mine, sorted_key * capacity + position, spare)
    padded = torch.zeros(spare + 1, x.shape[1], dtype=x.dtype, device=x.device)
    padded[slot] = x
    batched = padded[:spare].view(rows, capacity, x.shape[1])
    h = torch.bmm(batched, grouped.gate_up.transpose(1, 2))
    y = torch.bmm(torch.nn.functional.silu(h[..., :inter]) * h[..., inter:], grouped.down.transpose(1, 2))
    return y.reshape(spare, -1)[slot.clamp(max=spare - 1)]


def _direct_experts(
    config: EngineConfig,
    grouped: GroupedExperts,
    tokens: torch.Tensor,
    key: torch.Tensor,
    gate_weights: torch.Tensor,
) -> torch.Tensor:
    """Each pair through its own expert's rows (gathered: a copy, fine for the few tokens this is for),
    in the same dtype steps as the grouped matmul; each token's k contributions summed in choice order.
    `key` [T, k]: the stack row of each pair here, or R (another rank's, or padding)."""
    rows, inter = grouped.rows, config.intermediate_size
    mine = key < rows
    safe = key.clamp(max=rows - 1)
    x = tokens.to(grouped.gate_up.dtype)
    h = torch.matmul(grouped.gate_up[safe], x[:, None, :, None]).squeeze(-1)  # [T, k, 2I]
    act = torch.nn.functional.silu(h[..., :inter]) * h[..., inter:]
    y = torch.matmul(grouped.down[safe], act.unsqueeze(-1)).squeeze(-1)  # [T, k, H]
    contribution = torch.where(mine.unsqueeze(-1), y.float() * gate_weights.unsqueeze(-1), 0.0)
    out = torch.zeros_like(tokens)
    for choice in range(key.shape[1]):  # in choice order, as the fused kernel adds them
        out += contribution[:, choice]
    return out
