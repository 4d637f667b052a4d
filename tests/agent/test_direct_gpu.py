"""The `direct` expert kernel fused in Triton (`direct_triton`) on a GPU: the same partial outputs and
routing counts as its torch form and as the sorted grouped step, for a rank holding every expert and
for one of two ranks, padding tokens included, eagerly and replayed from a captured graph; and the
bucket tuner offers it for a few tokens. In-process, but Triton builds its kernels in child processes
(the compiler), hence `processes`; skipped without CUDA and Triton."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine_agent import moe, step_graphs
from engine_agent.grouped import Kernel
from engine_agent.protocol import EngineConfig
from tests.agent.driver import relative_error

DEVICE = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.processes,
    pytest.mark.skipif(
        not step_graphs.fused_direct_available(DEVICE), reason="needs a CUDA device and Triton"
    ),
]

CONFIG = EngineConfig(
    num_logical_experts=16, num_redundant_experts=4, hidden_size=256, intermediate_size=176, top_k=4,
    num_moe_layers=2, dtype="bfloat16",
)  # fmt: skip
BF16_TOL = 2e-2  # bf16 experts, relative error: accumulation order differs between kernels (test_gpu.py)
# Two ranks; experts 0 and 5 twice (on both ranks, and twice on rank 0).
PLACEMENT = [[0, 1, 2, 3, 4, 5, 6, 7, 0, 5], [8, 9, 10, 11, 12, 13, 14, 15, 0, 5]]


def views_of(rank: int, kernel: Kernel) -> list[moe.LayerView]:
    wanted = {layer: sorted(set(PLACEMENT[rank])) for layer in range(CONFIG.num_moe_layers)}
    weights, stacks = moe.stack_buffers(CONFIG, wanted, DEVICE)
    for expert, view in weights.items():
        view.copy_(moe.expert_weights(CONFIG, expert))
    routers = [moe.router_weights(CONFIG, DEVICE, layer) for layer in range(CONFIG.num_moe_layers)]
    views = moe.layer_views(CONFIG, [PLACEMENT] * 2, weights, routers, DEVICE, rank=rank, stacks=stacks)
    chosen = []
    for layer in views:
        assert layer.grouped is not None
        chosen.append(dataclasses.replace(layer, grouped=dataclasses.replace(layer.grouped, kernel=kernel)))
    return chosen


def counts(valid: int, start: int, end: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    values = torch.tensor([valid, start, end], device=DEVICE)
    return values[0], (values[1], values[2])


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize(("size", "valid"), [(1, 1), (8, 5), (16, 16)])
def test_the_fused_direct_kernel_equals_its_torch_form_and_the_sorted_step(
    rank: int, size: int, valid: int
) -> None:
    tokens = torch.randn(size, CONFIG.hidden_size, device=DEVICE)
    device_valid, own = counts(valid, 1, valid)
    for fused_view, grouped_view in zip(views_of(rank, "direct"), views_of(rank, "grouped_mm"), strict=True):
        fused, fused_load = step_graphs.layer_step(CONFIG, fused_view, rank, tokens, device_valid, own, size)
        assert fused_view.grouped is not None
        experts, gate_weights = moe.route(CONFIG, fused_view.router, tokens)
        torch_form = moe.grouped_share(
            CONFIG, fused_view.grouped, tokens, experts, gate_weights, valid=device_valid
        )
        sorted_out, sorted_load = step_graphs.layer_step(
            CONFIG, grouped_view, rank, tokens, device_valid, own, size
        )
        assert relative_error(fused, torch_form) < BF16_TOL
        assert relative_error(fused, sorted_out) < BF16_TOL
        assert torch.count_nonzero(fused[valid:]) == 0
        assert torch.equal(fused_load, sorted_load) and int(fused_load.sum()) == (valid - 1) * CONFIG.top_k
        tokens = fused  # the next layer's input, as the step chains them


def test_the_direct_kernel_replays_from_a_captured_graph_and_the_tuner_offers_it() -> None:
    views = views_of(0, "grouped_mm")
    graphs = step_graphs.capture(CONFIG, views, 0, DEVICE, [1, 4, 64], kernels={1: "direct", 4: "direct"})
    try:
        assert graphs.captured and graphs.kernels[1] == graphs.kernels[4] == "direct"
        tuned = step_graphs.capture(CONFIG, views, 0, DEVICE, [2])
        assert tuned.kernels[2] in ("grouped_mm", "padded", "direct")  # timed with direct among them
        tuned.release()
        bucket = graphs.bucket(3)
        assert bucket is not None and bucket.size == 4
        tokens = torch.randn(3, CONFIG.hidden_size, device=DEVICE)
        bucket.inputs[:3].copy_(tokens)
        bucket.set_counts(3, 0, 3)
        replayed, load = (t.clone() for t in bucket.run(0))
        eager, eager_load = step_graphs.layer_step(CONFIG, views[0], 0, tokens, None, (0, 3), None)
        assert relative_error(replayed[:3], eager) < BF16_TOL
        assert torch.count_nonzero(replayed[3:]) == 0 and torch.equal(load, eager_load)
    finally:
        graphs.release()
