"""The serving step in fixed shapes, on CPU: a step is padded to the smallest bucket that holds it, its
padding changes no output and counts no load, past the largest bucket it runs eagerly; the reference
engine serves the reference output through its buckets. (Capturing the buckets as CUDA graphs, and
replaying them, runs on a GPU: `test_gpu.py`.) In-process: a world-1 gloo group, no agent processes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from engine_agent import groups, moe, step_graphs
from engine_agent.engine import ReferenceEngine
from engine_agent.grouped import Kernel
from engine_agent.protocol import AgentState, EngineConfig, Platform
from engine_agent.serving import ActiveGeneration, EngineUnavailable
from tests.support.waiting import wait_until

CONFIG = EngineConfig(
    num_logical_experts=8, num_redundant_experts=2, hidden_size=16, intermediate_size=24, top_k=3,
    num_moe_layers=2,
)  # fmt: skip
PLACEMENT = [[0, 1, 2, 3, 4, 5, 6, 7, 0, 3]]  # experts 0 and 3 on two slots of the one rank


def test_a_step_takes_the_smallest_bucket_that_holds_it_and_none_past_the_largest() -> None:
    buckets = [1, 4, 16]
    assert [step_graphs.bucket_for(n, buckets) for n in (1, 2, 4, 5, 16, 17)] == [1, 4, 4, 16, 16, None]


def test_graphs_are_wanted_on_cuda_only_and_on_refuses_where_they_cannot_be() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")
    assert not step_graphs.graphs_wanted("auto", cpu, grouped_step=True)
    assert step_graphs.graphs_wanted("auto", cuda, grouped_step=True)
    assert not step_graphs.graphs_wanted("auto", cuda, grouped_step=False)
    assert not step_graphs.graphs_wanted("off", cuda, grouped_step=True)
    with pytest.raises(step_graphs.GraphsUnavailable, match="CUDA"):
        step_graphs.graphs_wanted("on", cpu, grouped_step=True)


def layer_views() -> list[moe.LayerView]:
    config = CONFIG
    wanted = {layer: sorted(set(PLACEMENT[0])) for layer in range(config.num_moe_layers)}
    weights, stacks = moe.stack_buffers(config, wanted, "cpu")
    for expert, view in weights.items():
        view.copy_(moe.expert_weights(config, expert))
    routers = [moe.router_weights(config, layer=layer) for layer in range(config.num_moe_layers)]
    return moe.layer_views(config, [PLACEMENT] * 2, weights, routers, "cpu", rank=0, stacks=stacks)


@pytest.mark.parametrize("kernel", ["grouped_mm", "padded", "direct"])
def test_padding_rows_change_no_output_and_count_no_load(kernel: Kernel) -> None:
    view = layer_views()[0]
    assert view.grouped is not None
    view = moe.LayerView(
        view.router, view.placement, view.table, view.weights,
        dataclasses.replace(view.grouped, kernel=kernel),
    )  # fmt: skip
    tokens = torch.randn(5, CONFIG.hidden_size)
    exact, exact_load = step_graphs.layer_step(CONFIG, view, 0, tokens, None, (0, 5), None)
    padded_tokens = torch.cat([tokens, torch.randn(11, CONFIG.hidden_size)])
    valid = torch.tensor(5)
    padded, padded_load = step_graphs.layer_step(
        CONFIG, view, 0, padded_tokens, valid, (torch.tensor(0), valid), capacity=16
    )
    torch.testing.assert_close(padded[:5], exact, rtol=1e-5, atol=1e-6)
    assert torch.count_nonzero(padded[5:]) == 0
    assert torch.equal(padded_load, exact_load) and int(exact_load.sum()) == 5 * CONFIG.top_k


@pytest.fixture
def engine() -> Iterator[ReferenceEngine]:
    """A reference engine with buckets 4 and 16 (run eagerly on CPU), serving a world-1 generation."""
    store = groups.start_store_server("127.0.0.1", 10.0)
    group = groups.create_group(
        name="ep", generation=1, store=groups.prefixed(store, "t/"), rank=0, size=1,
        platform=Platform.cpu, device=torch.device("cpu"), timeout_s=10.0,
    )  # fmt: skip
    engine = ReferenceEngine(CONFIG, torch.device("cpu"), grouped_step=True, graph_buckets=[4, 16])
    wanted = {layer: sorted(set(PLACEMENT[0])) for layer in range(CONFIG.num_moe_layers)}
    weights, stacks = moe.stack_buffers(CONFIG, wanted, "cpu")
    for expert, view in weights.items():
        view.copy_(moe.expert_weights(CONFIG, expert))
    views = engine.views_for([PLACEMENT] * 2, weights, rank=0, stacks=stacks)
    generation = ActiveGeneration(
        generation=1, group=group, members=["e0"], placements=[PLACEMENT] * 2, weights=weights,
        stacks=stacks, graphs=engine.capture_graphs(views, rank=0),
    )  # fmt: skip
    engine.switch(generation, views=views)
    yield engine
    engine.stop()
    groups.destroy_group(group)


@pytest.mark.parametrize("count", [1, 3, 4, 5, 20])
def test_the_engine_serves_the_reference_through_its_buckets_and_past_them(
    engine: ReferenceEngine, count: int
) -> None:
    tokens = torch.randn(count, CONFIG.hidden_size)
    result = engine.submit(tokens).result(timeout=30)
    reference = moe.reference_forward(CONFIG, tokens)
    assert float((result.outputs - reference).norm() / reference.norm()) < 1e-5
    assert engine.layer_expert_load() == [[int(v) for v in row] for row in _reference_load(tokens)], (
        "the padding rows counted as load"
    )


def _reference_load(tokens: torch.Tensor) -> torch.Tensor:
    hidden, rows = tokens.float(), []
    for layer in range(CONFIG.num_moe_layers):
        experts, _ = moe.route(CONFIG, moe.router_weights(CONFIG, layer=layer), hidden)
        rows.append(torch.bincount(experts.flatten(), minlength=CONFIG.num_logical_experts))
        hidden = moe.reference_forward(CONFIG.model_copy(update={"num_moe_layers": layer + 1}), tokens)
    return torch.stack(rows)


def test_a_one_member_group_steps_with_no_control_collective(engine: ReferenceEngine) -> None:
    """A world-1 generation's control all-reduce is the identity: it is not run (on a GPU it cost three
    waits for the device every step), and the outputs stay the reference's."""
    active = engine.active
    assert active is not None
    calls = []
    original = active.group.allreduce

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    active.group.allreduce = counted  # type: ignore[method-assign]
    tokens = torch.randn(3, CONFIG.hidden_size)
    result = engine.submit(tokens).result(timeout=30)
    reference = moe.reference_forward(CONFIG, tokens)
    assert float((result.outputs - reference).norm() / reference.norm()) < 1e-5
    assert calls == []


def test_a_one_member_group_given_up_still_ends_its_serving(engine: ReferenceEngine) -> None:
    active = engine.active
    assert active is not None
    active.group.abandon("told by a test")
    wait_until(lambda: engine.state == AgentState.idle, timeout_s=30, what="the engine left its generation")
    assert engine.counters.last_error is not None and "told by a test" in engine.counters.last_error
    with pytest.raises(EngineUnavailable):
        engine.submit(torch.randn(1, CONFIG.hidden_size))


def test_the_direct_kernel_serves_a_few_tokens_with_no_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    """The small-token kernel: each pair through its expert directly, no sort and no search (on a GPU
    those and their bookkeeping were most of a 1-token step), the same outputs and load as the sorted
    grouped step, padding included."""
    view = layer_views()[0]
    assert view.grouped is not None
    tokens = torch.cat([torch.randn(3, CONFIG.hidden_size), torch.randn(1, CONFIG.hidden_size)])
    valid = torch.tensor(3)
    sorted_out, sorted_load = step_graphs.layer_step(
        CONFIG, view, 0, tokens, valid, (torch.tensor(1), valid), capacity=4
    )

    def forbidden(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("the direct kernel sorted")

    monkeypatch.setattr(torch, "argsort", forbidden)
    monkeypatch.setattr(torch, "searchsorted", forbidden)
    direct = dataclasses.replace(view, grouped=dataclasses.replace(view.grouped, kernel="direct"))
    out, load = step_graphs.layer_step(CONFIG, direct, 0, tokens, valid, (torch.tensor(1), valid), capacity=4)
    torch.testing.assert_close(out, sorted_out, rtol=1e-5, atol=1e-6)
    assert torch.count_nonzero(out[3:]) == 0
    assert torch.equal(load, sorted_load) and int(load.sum()) == 2 * CONFIG.top_k


def test_a_faster_kernel_is_offered_only_if_it_computes_the_same_step() -> None:
    """The bucket tuner's guard: a candidate kernel (the fused `direct` one on a GPU) is timed only if
    its outputs and load equal the views' own kernel's on random tokens; a wrong one is left out."""
    view = layer_views()[0]
    assert view.grouped is not None
    direct = dataclasses.replace(view, grouped=dataclasses.replace(view.grouped, kernel="direct"))
    assert step_graphs.agrees(CONFIG, view, direct, 0, 4)
    wrong = dataclasses.replace(direct, router=-direct.router)  # other experts chosen: other outputs
    assert not step_graphs.agrees(CONFIG, view, wrong, 0, 4)
