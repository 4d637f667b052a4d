"""CUDA graphs of the serving step's compute, one per token-count bucket and MoE layer.

A generation's graphs depend on its placement, replica tables and expert views, so they are captured
for the new generation before it serves: in prepare on a side stream while the old generation still
serves (`capture_error_mode="thread_local"`: the serving thread's synchronisations and collectives
are not part of the capture), or inside the commit window for a deferred warm-up policy. The first
step after the switch replays them. A step of `n` tokens (all ranks' together) runs the graphs of the
smallest bucket >= n, its tokens padded to the bucket (padding rows are masked out: no pair of theirs
is computed or counted); past the largest bucket the step runs eagerly. The collectives stay outside
the graphs, between the layers.

A generation's graphs share one memory pool, captured largest bucket first so the smaller ones reuse
its intermediates. `release` (the background cleanup's job, never the window's) resets every graph
and gives the pool's memory back to the device.

Without CUDA (`capture=False`: CPU tests) the same padded buffers run eagerly, so bucketing and
masking are checked where graphs cannot be captured.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from engine_agent import moe
from engine_agent.grouped import Kernel
from engine_agent.protocol import EngineConfig, GraphCapture

log = logging.getLogger(__name__)

GraphSetting = Literal["auto", "on", "off"]
Outputs = tuple[torch.Tensor, torch.Tensor]  # one layer's partial output and routing counts
TUNE_REPLAYS = 10  # timed replays of each expert kernel's graph, to choose one per bucket
DIRECT_MAX_TOKENS = 16  # the largest bucket the `direct` kernel is timed for (`direct_triton.MAX_TOKENS`)
AGREE_REL_TOL = 2e-2  # bf16 experts: kernels sum in different orders (tests/agent/test_gpu.py's tolerance)


class GraphsUnavailable(ValueError):
    """`--cuda-graphs on` where the step cannot be captured."""


def graphs_wanted(setting: GraphSetting, device: torch.device, grouped_step: bool) -> bool:
    """Whether the engine captures its step (`auto`: on CUDA, ROCm included, with the batched step;
    `on` refuses where that is missing rather than serve differently than asked)."""
    capturable = device.type == "cuda" and grouped_step
    if setting == "on" and not capturable:
        why = "a CUDA device" if device.type != "cuda" else "the batched step (--grouped-step on|auto)"
        raise GraphsUnavailable(f"--cuda-graphs on needs {why}")
    return setting != "off" and capturable


def bucket_for(count: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket holding `count` tokens; None past the largest (the step runs eagerly)."""
    for size in buckets:  # sorted ascending
        if count <= size:
            return size
    return None


def layer_step(
    config: EngineConfig,
    view: moe.LayerView,
    rank: int,
    tokens: torch.Tensor,
    valid: moe.Count | None,
    own: tuple[moe.Count, moe.Count],
    capacity: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's compute for this rank over the gathered `tokens`: (partial output [T, H] fp32,
    routing counts of this rank's own rows [L]). The eager and the captured step are this function
    (`valid`: tokens past it are padding; None: none are)."""
    if view.grouped is not None and view.grouped.kernel == "direct" and fused_direct_available(tokens.device):
        from engine_agent import direct_triton  # Triton: imported only where it runs

        return direct_triton.direct_layer(
            config, view.router, view.grouped, tokens.float().contiguous(),
            *_device_counts(tokens, valid, own),
        )  # fmt: skip
    if view.grouped is None and not view.placement[rank]:  # no expert here: the load still counts
        experts, _ = moe.route(config, view.router, tokens)
        partial = torch.zeros_like(tokens, dtype=torch.float32)
    else:
        partial, experts = moe.local_contribution(
            config, view.router, tokens, rank, view.placement, view.table, view.weights, view.grouped,
            valid=valid, capacity=capacity,
        )  # fmt: skip
    return partial, moe.own_load(config, experts, *own)


def fused_direct_available(device: torch.device) -> bool:
    """Whether the `direct` kernel runs fused (`direct_triton`): on CUDA with Triton (not ROCm: not
    tried there). Elsewhere a `direct` view runs its torch form (`grouped`)."""
    return device.type == "cuda" and torch.version.hip is None and _triton_installed()


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _device_counts(
    tokens: torch.Tensor, valid: moe.Count | None, own: tuple[moe.Count, moe.Count]
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """`valid` and `own` as 0-dim int64 tensors on the tokens' device (a bucket's already are)."""

    def on_device(value: moe.Count) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value
        return torch.tensor(value, dtype=torch.int64, device=tokens.device)

    return on_device(tokens.shape[0] if valid is None else valid), (on_device(own[0]), on_device(own[1]))


@dataclass
class Bucket:
    """The graphs of one token count: a padded input shared by the layers, and each layer's outputs."""

    size: int
    inputs: torch.Tensor  # [size, H] fp32: the gathered tokens of a step go here (rows past n: padding)
    counts: torch.Tensor  # [3] int64 on the device: valid tokens, this rank's rows [start, end)
    host_counts: torch.Tensor  # the same, on the host (pinned on CUDA): one copy per step
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per layer
    graphs: list[Any] = field(default_factory=list)  # torch.cuda.CUDAGraph per layer (empty: eager)
    runs: list[Callable[[], tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)

    def set_counts(self, valid: int, start: int, end: int) -> None:
        # Through numpy: three tensor item writes cost ~10 us of dispatch in a 1-token step.
        self.host_counts.numpy()[:] = (valid, start, end)
        self.counts.copy_(self.host_counts, non_blocking=True)

    def run(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer` over `inputs`: the graph's replay (its outputs are the captured buffers), or
        the same ops run eagerly where nothing was captured."""
        if self.graphs:
            self.graphs[layer].replay()
            return self.outputs[layer]
        return self.runs[layer]()


@dataclass
class StepGraphs:
    """One generation's captured step (see the module doc)."""

    buckets: dict[int, Bucket]
    capture_ms: float = 0.0
    graph_bytes: int = 0
    captured: bool = False  # real CUDA graphs (False: the padded buffers run eagerly)
    count: int = 0  # graphs captured
    kernels: dict[int, Kernel] = field(default_factory=dict)  # the expert kernel of each bucket
    in_window: bool = False  # captured inside the commit window (the builder says so)
    pool: Any = None
    released: bool = False

    @property
    def sizes(self) -> list[int]:
        return sorted(self.buckets) if not self.released else []

    def bucket(self, count: int) -> Bucket | None:
        size = bucket_for(count, self.sizes)
        return None if size is None or self.released else self.buckets[size]

    def release(self) -> None:
        """Reset every graph and give the pool back to the device (the cleanup worker's job)."""
        if self.released:
            return
        self.released = True
        for bucket in self.buckets.values():
            for graph in bucket.graphs:
                graph.reset()
            bucket.graphs.clear()
            bucket.outputs.clear()
            bucket.runs.clear()
        self.buckets = {}
        if self.captured:
            torch.cuda.empty_cache()  # the pool's segments go back to the device only here


def capture(
    config: EngineConfig,
    views: list[moe.LayerView],
    rank: int,
    device: torch.device,
    buckets: Sequence[int],
    *,
    graphs: bool = True,
    kernels: dict[int, Kernel] | None = None,
    stream: Any = None,
) -> StepGraphs:
    """The step's graphs for every bucket (`graphs=False`: the padded buffers only, run eagerly).

    Each bucket runs the experts with the kernel `kernels` names for it; a bucket it does not name gets
    the faster of the kernels that run here, timed as graphs on the spot (the grouped matmul reads only
    the experts a step routes to, the padded batch reads all of them but with fewer kernels and better
    tiles for a few rows each: which wins depends on the token count). `StepGraphs.kernels` says what
    was used, so the next generation's capture need not time them again. `stream`: the side stream to
    capture on; pass the same one every time (cuBLAS keeps a 32 MiB workspace per stream it ran on,
    for the life of the process: a new stream per generation leaked one per generation)."""
    started = time.perf_counter()
    hidden = config.hidden_size
    counts = torch.zeros(3, dtype=torch.int64, device=device)
    host_counts = torch.zeros(3, dtype=torch.int64, pin_memory=graphs and device.type == "cuda")
    result = StepGraphs(buckets={}, captured=graphs)
    if not graphs:
        for size in sorted(buckets):
            bucket = Bucket(size, torch.zeros(size, hidden, device=device), counts, host_counts)
            bucket.runs = [_runner(config, view, rank, bucket) for view in views]
            result.buckets[size] = bucket
        result.capture_ms = (time.perf_counter() - started) * 1000.0
        return result
    result.pool = torch.cuda.graph_pool_handle()
    stream = stream or torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))  # the staged weights are written
    with torch.cuda.device(device), torch.cuda.stream(stream):
        for size in sorted(buckets, reverse=True):  # largest first: the smaller reuse its pool
            bucket = Bucket(size, torch.zeros(size, hidden, device=device), counts, host_counts)
            counts.fill_(0)
            counts[0], counts[2] = size, size
            kernel = (kernels or {}).get(size) or _fastest_kernel(config, views, rank, bucket)
            chosen = [_with_kernel(view, kernel) for view in views]
            bucket.runs = [_runner(config, view, rank, bucket) for view in chosen]
            bucket.runs[0]()  # warm-up on this stream: lazy handles and workspaces stay outside the graph
            for run in bucket.runs:
                graph, outputs = _captured(run, result.pool)
                bucket.graphs.append(graph)
                bucket.outputs.append(outputs)
            result.buckets[size] = bucket
            result.kernels[size] = kernel
    stream.synchronize()
    result.capture_ms = (time.perf_counter() - started) * 1000.0
    result.count = sum(len(b.graphs) for b in result.buckets.values())
    result.graph_bytes = _pool_bytes(result.pool) + sum(
        b.inputs.numel() * b.inputs.element_size() for b in result.buckets.values()
    )
    log.info(
        "captured %d step graphs (buckets %s, %d layers) in %.1f ms, %.1f MiB",
        len(result.buckets) * len(views), result.sizes, len(views), result.capture_ms,
        result.graph_bytes / 2**20,
    )  # fmt: skip
    return result


def _with_kernel(view: moe.LayerView, kernel: Kernel) -> moe.LayerView:
    if view.grouped is None or view.grouped.kernel == kernel:
        return view
    return dataclasses.replace(view, grouped=dataclasses.replace(view.grouped, kernel=kernel))


def _captured(run: Callable[[], Outputs], pool: Any) -> tuple[Any, Outputs]:
    """`run` captured as a graph, in `pool` (None: a pool of its own, released by its `reset`)."""
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(pool=pool, capture_error_mode="thread_local")
    try:
        outputs = run()
    finally:
        graph.capture_end()
    return graph, outputs


def _fastest_kernel(config: EngineConfig, views: list[moe.LayerView], rank: int, bucket: Bucket) -> Kernel:
    """The expert kernel whose graph of this bucket's first layer replays fastest here (median of a
    few replays, CUDA events): the padded batch only where the grouped matmul is the views' own, the
    direct kernel (no sort) for buckets of a few tokens where it runs fused. One that fails to build
    or capture here is left out."""
    grouped = views[0].grouped
    if grouped is None:
        return "padded"
    candidates: list[Kernel] = [grouped.kernel]
    if grouped.kernel == "grouped_mm":
        candidates.append("padded")
    if bucket.size <= DIRECT_MAX_TOKENS and fused_direct_available(bucket.inputs.device):
        candidates.append("direct")
    if len(candidates) == 1:
        return candidates[0]
    timed: dict[Kernel, float] = {}
    for kernel in candidates:
        try:
            if kernel != grouped.kernel and not agrees(
                config, views[0], _with_kernel(views[0], kernel), rank, bucket.size
            ):
                log.error(
                    "bucket %d: the %s kernel's outputs differ from %s's; left out",
                    bucket.size,
                    kernel,
                    grouped.kernel,
                )
                continue
            timed[kernel] = _replay_ms(_runner(config, _with_kernel(views[0], kernel), rank, bucket))
        except Exception:  # e.g. Triton cannot build here: the other kernels serve
            if kernel != "direct":
                raise
            log.exception("bucket %d: the direct kernel failed here; left out", bucket.size)
    choice: Kernel = min(timed, key=lambda k: timed[k])
    log.info("bucket %d: expert kernel %s (replay ms %s)", bucket.size, choice, timed)
    return choice


def agrees(config: EngineConfig, want: moe.LayerView, got: moe.LayerView, rank: int, size: int) -> bool:
    """Whether `got`'s kernel gives `want`'s outputs for `size` random tokens (fixed seed), eagerly: a
    faster kernel is offered only if it computes the same step (a wrong one would serve wrong answers)."""
    device = want.router.device
    generator = torch.Generator(device=device).manual_seed(size)
    tokens = torch.randn((size, config.hidden_size), generator=generator, device=device)
    own = (0, size)
    want_partial, want_load = layer_step(config, want, rank, tokens, size, own, capacity=size)
    got_partial, got_load = layer_step(config, got, rank, tokens, size, own, capacity=size)
    error = float((got_partial - want_partial).norm()) / max(float(want_partial.norm()), 1e-12)
    return error <= AGREE_REL_TOL and torch.equal(got_load, want_load)


def _replay_ms(run: Callable[[], Outputs]) -> float:
    """The median replay time of `run` captured as a graph (ms, CUDA events)."""
    run()  # warm-up, outside the graph
    # Its own pool: resetting a graph of the shared pool would release the pool for all of them.
    graph, outputs = _captured(run, None)
    times = []
    for replay in range(TUNE_REPLAYS + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if replay >= 2:
            times.append(start.elapsed_time(end))
    graph.reset()
    del outputs
    return sorted(times)[len(times) // 2]


def summary(graphs: StepGraphs | None) -> GraphCapture | None:
    """What the status and the job record of a generation's graphs."""
    if graphs is None:
        return None
    return GraphCapture(
        buckets=graphs.sizes,
        graphs=graphs.count,
        capture_ms=round(graphs.capture_ms, 3),
        graph_bytes=graphs.graph_bytes,
        in_window=graphs.in_window,
        kernels=[graphs.kernels.get(size, "eager") for size in graphs.sizes],
    )


def _runner(
    config: EngineConfig, view: moe.LayerView, rank: int, bucket: Bucket
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    counts = bucket.counts

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return layer_step(
            config, view, rank, bucket.inputs, counts[0], (counts[1], counts[2]), capacity=bucket.size
        )

    return run


def _pool_bytes(pool: Any) -> int:
    """Bytes the allocator holds in the graphs' private pool (its segments in a memory snapshot)."""
    try:
        segments = torch.cuda.memory_snapshot()
    except Exception:  # an allocator without snapshots: the pool's size is not known
        return 0
    return sum(int(s["total_size"]) for s in segments if tuple(s.get("segment_pool_id", ())) == tuple(pool))
