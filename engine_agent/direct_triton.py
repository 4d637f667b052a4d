# mypy: allow-untyped-defs
"""The `direct` expert kernel of a few tokens as three fused Triton kernels: one MoE layer of one rank
with no sort, no dispatch bookkeeping and no scatter (`grouped`'s module doc says why).

1. route: per token, the router's logits, softmax, top-k and its renormalised weights (the math of
   `moe.route`), then each pair's stack row here (`GroupedExperts.pair_keys`; R for another rank's pair
   or a padding token's);
2. gate/up: per pair and block of the intermediate size, its expert's gate and up rows against the
   token, SiLU(gate) * up, rounded where the grouped matmul rounds (the weights' dtype);
3. down: per token and block of the hidden size, its k pairs' down rows against their activations,
   each times its gate weight, summed in choice order: the token's partial output, written whole (a
   token with no pair here: zeros), so no buffer needs zeroing first.

The layer's routing counts of this rank's own rows (`moe.own_load`) are one program of kernel 2. The
counts (valid tokens, own rows) are read on the device, so the three kernels capture as a graph per
bucket. Imported only where Triton and CUDA are (`triton_available`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine_agent.grouped import GroupedExperts
from engine_agent.protocol import EngineConfig

MAX_TOKENS = 16  # the largest bucket this kernel is offered for (its load program holds T*k x L)
# Tiles (rows, reduction chunk, warps) per kernel, chosen on an H100 at DeepSeek-V2-Lite-like shapes.
TILES = {"route": (0, 256, 8), "gate_up": (16, 256, 4), "down": (16, 256, 4)}


@triton.jit(do_not_specialize=["rows"])
def _route_kernel(
    x_ptr, router_ptr, pair_rows_ptr, replicas_ptr, valid_ptr, keys_ptr, weights_ptr, experts_ptr, rows,
    H: tl.constexpr, L: tl.constexpr, L_P2: tl.constexpr, K: tl.constexpr, WIDTH: tl.constexpr,
    BLOCK_H: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    valid = tl.load(valid_ptr)
    if t >= valid:  # a padding token: no pair of its is computed or counted
        for j in tl.static_range(K):
            tl.store(keys_ptr + t * K + j, rows)
            tl.store(experts_ptr + t * K + j, -1)
            tl.store(weights_ptr + t * K + j, 0.0)
    else:
        offs_l = tl.arange(0, L_P2)
        lmask = offs_l < L
        acc = tl.zeros([L_P2], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            offs_h = h0 + tl.arange(0, BLOCK_H)
            hmask = offs_h < H
            xv = tl.load(x_ptr + t * H + offs_h, mask=hmask, other=0.0)
            r = tl.load(
                router_ptr + offs_l[:, None] * H + offs_h[None, :],
                mask=lmask[:, None] & hmask[None, :], other=0.0,
            )  # fmt: skip
            acc += tl.sum(r * xv[None, :], axis=1)
        logits = tl.where(lmask, acc, float("-inf"))
        e = tl.where(lmask, tl.exp(logits - tl.max(logits, axis=0)), 0.0)
        probs = tl.where(lmask, e / tl.sum(e, axis=0), -1.0)
        total = 0.0
        left = probs
        for _ in tl.static_range(K):  # the top-k's sum first, as `route` divides by it
            best = tl.max(left, axis=0)
            total += best
            left = tl.where(offs_l == tl.argmax(left, axis=0), -1.0, left)
        left = probs
        for j in tl.static_range(K):
            best = tl.max(left, axis=0)
            expert = tl.argmax(left, axis=0)
            left = tl.where(offs_l == expert, -1.0, left)
            replica = t % tl.load(replicas_ptr + expert)
            key = tl.load(pair_rows_ptr + expert * WIDTH + replica)
            tl.store(keys_ptr + t * K + j, key.to(tl.int32))
            tl.store(experts_ptr + t * K + j, expert.to(tl.int64))
            tl.store(weights_ptr + t * K + j, best / total)


@triton.jit(do_not_specialize=["rows", "stride_row"])
def _gate_up_kernel(
    x_ptr, w_ptr, keys_ptr, experts_ptr, start_ptr, end_ptr, act_ptr, load_ptr, rows, stride_row,
    H: tl.constexpr, INTER: tl.constexpr, K: tl.constexpr, L: tl.constexpr, L_P2: tl.constexpr,
    P: tl.constexpr, P_P2: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    nb = tl.program_id(1)
    if (p == 0) & (nb == 0):  # the routing counts of this rank's own rows, one program
        start = tl.load(start_ptr)
        end = tl.load(end_ptr)
        offs_p = tl.arange(0, P_P2)
        pmask = offs_p < P
        chosen = tl.load(experts_ptr + offs_p, mask=pmask, other=-1)
        token = offs_p // K
        own = pmask & (token >= start) & (token < end)
        offs_l = tl.arange(0, L_P2)
        hits = (chosen[None, :] == offs_l[:, None]) & own[None, :]
        tl.store(load_ptr + offs_l, tl.sum(hits.to(tl.int64), axis=1), mask=offs_l < L)
    row = tl.load(keys_ptr + p)
    if row < rows:
        dtype = w_ptr.dtype.element_ty
        t = p // K
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = offs_n < INTER
        base = w_ptr + row.to(tl.int64) * stride_row
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
    H: tl.constexpr, INTER: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_I: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    nb = tl.program_id(1)
    dtype = w_ptr.dtype.element_ty
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < H
    out = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(K):
        p = t * K + j
        row = tl.load(keys_ptr + p)
        if row < rows:
            base = w_ptr + row.to(tl.int64) * stride_row
            y = tl.zeros([BLOCK_N], dtype=tl.float32)
            for i0 in range(0, INTER, BLOCK_I):
                offs_i = i0 + tl.arange(0, BLOCK_I)
                imask = offs_i < INTER
                a = tl.load(act_ptr + p * INTER + offs_i, mask=imask, other=0.0).to(tl.float32)
                w = tl.load(
                    base + offs_n[:, None] * INTER + offs_i[None, :],
                    mask=nmask[:, None] & imask[None, :], other=0.0,
                )  # fmt: skip
                y += tl.sum(w.to(tl.float32) * a[None, :], axis=1)
            out += y.to(dtype).to(tl.float32) * tl.load(weights_ptr + p)
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
    keys = torch.empty(pairs, dtype=torch.int32, device=device)
    chosen = torch.empty(pairs, dtype=torch.int64, device=device)
    weights = torch.empty(pairs, dtype=torch.float32, device=device)
    act = torch.empty(pairs, inter, dtype=grouped.gate_up.dtype, device=device)
    out = torch.empty(count, hidden, dtype=torch.float32, device=device)
    load = torch.empty(experts, dtype=torch.int64, device=device)
    l_p2 = triton.next_power_of_2(experts)
    _, chunk, warps = TILES["route"]
    _route_kernel[(count,)](
        tokens, router, grouped.pair_rows, grouped.replica_counts, valid, keys, weights, chosen, rows,
        H=hidden, L=experts, L_P2=l_p2, K=top_k, WIDTH=grouped.pair_rows.shape[1], BLOCK_H=chunk,
        num_warps=warps,
    )  # fmt: skip
    block, chunk, warps = TILES["gate_up"]
    _gate_up_kernel[(pairs, triton.cdiv(inter, block))](
        tokens, grouped.gate_up, keys, chosen, own[0], own[1], act, load, rows, grouped.gate_up.stride(0),
        H=hidden, INTER=inter, K=top_k, L=experts, L_P2=l_p2, P=pairs, P_P2=triton.next_power_of_2(pairs),
        BLOCK_N=block, BLOCK_H=chunk, num_warps=warps,
    )  # fmt: skip
    block, chunk, warps = TILES["down"]
    _down_kernel[(count, triton.cdiv(hidden, block))](
        act, grouped.down, keys, weights, out, rows, grouped.down.stride(0),
        H=hidden, INTER=inter, K=top_k, BLOCK_N=block, BLOCK_I=chunk, num_warps=warps,
    )  # fmt: skip
    return out, load
