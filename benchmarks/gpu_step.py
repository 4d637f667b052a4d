"""The serving step on one GPU, in-process, for `gpu.py`: the reference engine's own step (its
`ReferenceEngine`, a world-1 NCCL group, the batched expert stack) for several token counts with and
without CUDA graphs, beside the bare compute of the same work (the anchor the step is held to).

The bare compute of `n` tokens: the experts a balanced routing of its n*k pairs touches (min(n*k, E)
of them, each with ceil(n*k / that) rows) through gate/up, SiLU and down as two batched matmuls over
the same stacked weights, nothing else: no routing, no dispatch, no collective, no copy to the host.
Timed eagerly and as a CUDA graph's replay (CUDA events, median).

Expert weights are random on the device here (the step's time does not depend on their values; the
agent part of `gpu.py` and the GPU tests check outputs against the reference).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

from engine_agent import groups, moe
from engine_agent.engine import ReferenceEngine
from engine_agent.protocol import EngineConfig, Platform
from engine_agent.serving import ActiveGeneration


def _median_ms(run: Any, reps: int, device: torch.device) -> float:
    for _ in range(5):
        run()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 4)


def bare_compute(config: EngineConfig, device: torch.device, sizes: list[int], reps: int) -> dict[int, Any]:
    """Per token count: the bare compute's eager and graph-replayed time (ms)."""
    dtype = moe.torch_dtype(config)
    hidden, inter = config.hidden_size, config.intermediate_size
    experts = config.num_logical_experts
    stack = torch.randn(experts, moe.expert_numel(config), device=device, dtype=dtype) * 0.02
    gate_up = stack[:, : 2 * inter * hidden].view(experts, 2 * inter, hidden)
    down = stack[:, 2 * inter * hidden :].view(experts, hidden, inter)
    results: dict[int, Any] = {}
    for size in sizes:
        pairs = size * min(config.top_k, experts)
        touched = min(pairs, experts)
        rows = math.ceil(pairs / touched)
        x = torch.randn(touched, rows, hidden, device=device, dtype=dtype)
        w1, w2 = gate_up[:touched].transpose(1, 2), down[:touched].transpose(1, 2)

        def layer(x: torch.Tensor = x, w1: torch.Tensor = w1, w2: torch.Tensor = w2) -> torch.Tensor:
            h = torch.bmm(x, w1)
            return torch.bmm(torch.nn.functional.silu(h[..., :inter]) * h[..., inter:], w2)

        eager = _median_ms(layer, reps, device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            layer()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        started = time.perf_counter()
        with torch.cuda.graph(graph):
            layer()
        capture_ms = (time.perf_counter() - started) * 1000.0
        replay = _median_ms(graph.replay, reps, device)
        results[size] = {
            "experts_touched": touched,
            "rows_per_expert": rows,
            "eager_ms": eager,
            "graph_ms": replay,
            "capture_ms": round(capture_ms, 2),
        }
        graph.reset()
    return results


@contextlib.contextmanager
def serving_engine(
    config: EngineConfig, device: torch.device, *, graphs: bool, buckets: list[int], name: str = "step"
) -> Iterator[tuple[ReferenceEngine, groups.CommGroup, dict[str, Any]]]:
    """A reference engine serving generation 1 over a world-1 NCCL group (random weights), with or
    without step graphs; yields (engine, group, what its graphs cost)."""
    store = groups.start_store_server("127.0.0.1", 30.0)
    group = groups.create_group(
        name="ep", generation=1, store=groups.prefixed(store, f"{name}/{graphs}/"), rank=0, size=1,
        platform=Platform.cuda, device=device, timeout_s=60.0,
    )  # fmt: skip
    groups.warm_up(group)
    engine = ReferenceEngine(config, device, grouped_step=True, graph_buckets=buckets if graphs else None)
    placement = [[e % config.num_logical_experts for e in range(config.num_logical_experts)]]
    weights, stacks = moe.stack_buffers(config, {0: sorted(set(placement[0]))}, device)
    generator = torch.Generator(device=device).manual_seed(0)
    for stack in stacks.values():
        stack.buffer.normal_(0.0, 0.02, generator=generator)
    views = engine.views_for([placement], weights, rank=0, stacks=stacks)
    allocated = torch.cuda.memory_allocated(device)
    step_graphs = engine.capture_graphs(views, rank=0)
    cost: dict[str, Any] = {}
    if step_graphs is not None:
        cost["capture_ms"] = round(step_graphs.capture_ms, 2)
        cost["graph_bytes"] = step_graphs.graph_bytes
        cost["graph_count"] = step_graphs.count
        cost["kernels"] = {size: step_graphs.kernels.get(size) for size in step_graphs.sizes}
        cost["allocated_growth_bytes"] = torch.cuda.memory_allocated(device) - allocated
    generation = ActiveGeneration(
        generation=1, group=group, members=["bench"], placements=[placement], weights=weights,
        stacks=stacks, graphs=step_graphs,
    )  # fmt: skip
    engine.switch(generation, views=views)
    try:
        yield engine, group, cost
    finally:
        engine.stop()
        if step_graphs is not None:
            step_graphs.release()
        groups.destroy_group(group)


def engine_steps(
    config: EngineConfig,
    device: torch.device,
    *,
    graphs: bool,
    buckets: list[int],
    sizes: list[int],
    requests: int,
) -> dict[str, Any]:
    """The reference engine's step p50 (ms, its own step timer) per token count, one request at a
    time, with or without the step's graphs; with graphs, their capture time and memory."""
    with serving_engine(config, device, graphs=graphs, buckets=buckets) as (engine, _, cost):
        out: dict[str, Any] = {"graphs": graphs, "steps_ms": {}, **cost}
        for size in sizes:
            tokens = torch.randn(size, config.hidden_size)
            for _ in range(5):
                engine.submit(tokens).result(timeout=60)
            seen = len(engine.step_times_ms())
            for _ in range(requests):
                engine.submit(tokens).result(timeout=60)
            times = engine.step_times_ms()[seen:]
            out["steps_ms"][size] = {
                "p50": round(statistics.median(times), 4),
                "min": round(min(times), 4),
                "max": round(max(times), 4),
                "n": len(times),
            }
        out["graph_steps"] = engine.counters.graph_steps
    return out
