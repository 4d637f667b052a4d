# mypy: allow-untyped-defs
"""The `direct` expert kernel of a few tokens as three fused Triton kernels: one MoE layer of one rank
with no sort, no dispatch bookkeeping and no scatter (`grouped`'s module doc says why).

1. logits: per token and a few experts, the router's fp32 logits (many programs, each one load wave);
2. gate/up: per (token, choice) pair and block of the intermediate size, the pair's routing from its
   token's logits (the math of `moe.route`: softmax, top-k, renormalised; then its stack row here as
   `GroupedExperts.pair_keys`: R for another rank's pair or a padding token's), then its expert's gate
   and up rows against the token, SiLU(gate) * up, rounded where the grouped matmul rounds;
3. down: per token and block of the hidden size, its k pairs' down rows against their activations in
   one load wave, each times its gate weight, summed: the token's partial output, written whole (a
   token with no pair here: zeros), so no buffer needs zeroing first.

The layer's routing counts of this rank's own rows (`moe.own_load`) are one program of kernel 2. The
counts (valid tokens, own rows) are read on the device, so the kernels capture as a graph per bucket.
Each program issues its loads at once rather than in a loop of dependent rounds: a step of one token
reads ~100 MB spread over many programs, and a loop per program was latency-bound (the down kernel took
50 us in a first version). Imported only where Triton and CUDA are (`step_graphs.fused_direct_available`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine_agent.grouped import GroupedExperts
from engine_agent.protocol import EngineConfig

MAX_TOKENS = 16  # the largest bucket this kernel is offered for (its load program loops over tokens)
# Tiles (rows per program, reduction chunk, warps), chosen on an H100 at DeepSeek-V2-Lite-like shapes.
TILES = {"logits": (2, 0, 4), "gate_up": (4, 2048, 4), "down": (2, 2048, 8)}


@triton.jit
def _logits_kernel(x_ptr, router_ptr, logits_ptr, H: tl.constexpr, H_P2: tl.constexpr, L: tl.constexpr,
                   BLOCK_L: tl.constexpr):  # fmt: skip
    t = tl.program_id(0)
    offs_l = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_h = tl.arange(0, H_P2)
    lmask, hmask = offs_l < L, offs_h < H
    xv = tl.load(x_ptr + t * H + offs_h, mask=hmask, other=0.0)
    r = tl.load(
        router_ptr + offs_l[:, None] * H + offs_h[None, :], mask=lmask[:, None] & hmask[None, :], other=0.0
    )
    tl.store(logits_ptr + t * L + offs_l, tl.sum(r * xv[None, :], axis=1), mask=lmask)


@triton.jit
def _probs(logits_ptr, t, L: tl.constexpr, L_P2: tl.constexpr):
    """Token t's softmax over the experts (lanes past L: -1, never chosen)."""
    offs_l = tl.arange(0, L_P2)
    logits = tl.load(logits_ptr + t * L + offs_l, mask=offs_l < L, other=float("-inf"))
    e = tl.exp(logits - tl.max(logits, axis=0))
    return tl.where(offs_l < L, e / tl.sum(e, axis=0), -1.0)


@triton.jit(do_not_specialize=["rows", "stride_row"])
def _gate_up_kernel(
    x_ptr, w_ptr, logits_ptr, pair_rows_ptr, replicas_ptr, valid_ptr, start_ptr, end_ptr, keys_ptr,
    weights_ptr, act_ptr, load_ptr, rows, stride_row,
    T: tl.constexpr, H: tl.constexpr, INTER: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
    L_P2: tl.constexpr, WIDTH: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    nb = tl.program_id(1)
    offs_l = tl.arange(0, L_P2)
    if (p == 0) & (nb == 0):  # the routing counts of this rank's own rows, one program
        start, end = tl.load(start_ptr), tl.load(end_ptr)
        count = tl.zeros([L_P2], dtype=tl.int64)
        for token in range(T):
            left = _probs(logits_ptr, token, L, L_P2)
            own = (token >= start) & (token < end)
            for _ in tl.static_range(K):
                hit = offs_l == tl.argmax(left, axis=0)
                count += (hit & own).to(tl.int64)
                left = tl.where(hit, -1.0, left)
        tl.store(load_ptr + offs_l, count, mask=offs_l < L)
    t = p // K
    j = p % K
    left = _probs(logits_ptr, t, L, L_P2)
    total = 0.0
    weight = 0.0
    expert = 0
    for rank in tl.static_range(K):  # the top-k in order; this pair is choice j
        best = tl.max(left, axis=0)
        index = tl.argmax(left, axis=0)
        total += best
        weight = tl.where(rank == j, best, weight)
        expert = tl.where(rank == j, index, expert)
        left = tl.where(offs_l == index, -1.0, left)
    expert = tl.minimum(expert, L - 1)
    key = tl.load(pair_rows_ptr + expert * WIDTH + t % tl.load(replicas_ptr + expert))
    key = tl.where(t < tl.load(valid_ptr), key, rows)  # a padding token's pairs are nobody's
    if nb == 0:
        tl.store(keys_ptr + p, key)
        tl.store(weights_ptr + p, weight / total)
    if key < rows:
        dtype = w_ptr.dtype.element_ty
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < INTER
        base = w_ptr + key * stride_row
        acc_gate = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            offs_h = h0 + tl.arange(0, BLOCK_H)
            hmask = offs_h < H
            xv = tl.load(x_ptr + t * H + offs_h, mask=hmask, other=0.0).to(dtype).to(tl.float32)
            wmask = nmask[:, None] & hmask[None, :]
            gate = tl.load(base + offs_n[:, None] * H + offs_h[None, :], mask=wmask, other=0.0)
            up = tl.load(base + (INTER + offs_n[:, None]) * H + offs_h[None, :], mask=wmask, other=0.0)
            acc_gate += tl.sum(gate.to(tl.float32) * xv[None, :], axis=1)
            acc_up += tl.sum(up.to(tl.float32) * xv[None, :], axis=1)
        gate_h = acc_gate.to(dtype).to(tl.float32)
        up_h = acc_up.to(dtype).to(tl.float32)
        silu = (gate_h / (1.0 + tl.exp(-gate_h))).to(dtype).to(tl.float32)
        tl.store(act_ptr + p * INTER + offs_n, (silu * up_h).to(dtype), mask=nmask)


@triton.jit(do_not_specialize=["rows", "stride_row"])
def _down_kernel(
    act_ptr, w_ptr, keys_ptr, weights_ptr, out_ptr, rows, stride_row,
    H: tl.constexpr, INTER: tl.constexpr, K: tl.constexpr, K_P2: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_I: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    dtype = w_ptr.dtype.element_ty
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < H
    offs_j = tl.arange(0, K_P2)
    pairs = t * K + offs_j
    keys = tl.load(keys_ptr + pairs, mask=offs_j < K, other=rows)
    mine = keys < rows
    base = w_ptr + tl.where(mine, keys, 0) * stride_row  # [K_P2] pointers: every choice's loads at once
    y = tl.zeros([K_P2, BLOCK_N], dtype=tl.float32)
    for i0 in range(0, INTER, BLOCK_I):
        offs_i = i0 + tl.arange(0, BLOCK_I)
        imask = offs_i < INTER
        a = tl.load(
            act_ptr + pairs[:, None] * INTER + offs_i[None, :], mask=mine[:, None] & imask[None, :], other=0.0
        )
        w = tl.load(
            base[:, None, None] + offs_n[None, :, None] * INTER + offs_i[None, None, :],
            mask=mine[:, None, None] & nmask[None, :, None] & imask[None, None, :], other=0.0,
        )  # fmt: skip
        y += tl.sum(w.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)
    gate = tl.load(weights_ptr + pairs, mask=mine, other=0.0)
    out = tl.sum(y.to(dtype).to(tl.float32) * gate[:, None], axis=0)
    tl.store(out_ptr + t * H + offs_n, out, mask=nmask)


def direct_layer(
    config: EngineConfig,
    router: torch.Tensor,
    grouped: GroupedExperts,
    tokens: torch.Tensor,
    valid: torch.Tensor,
    own: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer of this rank over the bucket's `tokens` [T, H] fp32: (partial output [T, H] fp32,
    routing counts of its own rows [L] int64). `valid`, `own`: 0-dim int64 device tensors."""
    count, hidden = tokens.shape
    top_k = min(config.top_k, config.num_logical_experts)
    experts, inter = config.num_logical_experts, config.intermediate_size
    pairs, device, rows = count * top_k, tokens.device, grouped.rows
    logits = torch.empty(count, experts, dtype=torch.float32, device=device)
    keys = torch.empty(pairs, dtype=torch.int64, device=device)
    weights = torch.empty(pairs, dtype=torch.float32, device=device)
    act = torch.empty(pairs, inter, dtype=grouped.gate_up.dtype, device=device)
    out = torch.empty(count, hidden, dtype=torch.float32, device=device)
    load = torch.empty(experts, dtype=torch.int64, device=device)
    block, _, warps = TILES["logits"]
    h_p2 = triton.next_power_of_2(hidden)
    _logits_kernel[(count, triton.cdiv(experts, block))](
        tokens, router, logits, H=hidden, H_P2=h_p2, L=experts, BLOCK_L=block, num_warps=warps
    )
    block, chunk, warps = TILES["gate_up"]
    _gate_up_kernel[(pairs, triton.cdiv(inter, block))](
        tokens, grouped.gate_up, logits, grouped.pair_rows, grouped.replica_counts, valid, own[0], own[1],
        keys, weights, act, load, rows, grouped.gate_up.stride(0),
        T=count, H=hidden, INTER=inter, K=top_k, L=experts, L_P2=triton.next_power_of_2(experts),
        WIDTH=grouped.pair_rows.shape[1], BLOCK_N=block, BLOCK_H=min(chunk, h_p2), num_warps=warps,
    )  # fmt: skip
    block, chunk, warps = TILES["down"]
    _down_kernel[(count, triton.cdiv(hidden, block))](
        act, grouped.down, keys, weights, out, rows, grouped.down.stride(0),
        H=hidden, INTER=inter, K=top_k, K_P2=triton.next_power_of_2(top_k), BLOCK_N=block,
        BLOCK_I=min(chunk, triton.next_power_of_2(inter)), num_warps=warps,
    )  # fmt: skip
    return out, load
