"""The `direct` expert kernel's tiles swept on a GPU (`engine_agent/direct_triton.py`, `TILES`): for each
token count of the buckets it is offered for, each of its three kernels' tiles (rows per program,
reduction chunk, warps) tried in turn with the others held (logits, then gate/up, then down: each
kernel keeps the best tile found before it), every tile's outputs checked against the kernel's torch
form (`grouped._direct_experts` through `moe.grouped_share`) and its routing counts against
`moe.own_load`, a padded bucket included. Beside them, in the same run: the grouped matmul and the
padded batch (the kernels the bucket tuner weighs it against) and the bare compute (`gpu_step`).

One layer of one rank holding every expert (random bf16 weights, the engine's fp32 router). Times are
a captured graph's replays back to back (CUDA events over a batch of replays, median of batches): the
device time of the layer, launch latency hidden, as the kernels compare; the bucket tuner and
`gpu.py` time single replays.

    .venv/bin/python benchmarks/direct_sweep.py --name direct_sweep-h100     # on a CUDA host
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import gpu_step
from common import Report

Tile = tuple[int, int, int]
BATCH = 20  # replays per timed batch
BATCHES = 7


def candidates(kernel: str, hidden: int, inter: int, top_k: int) -> list[Tile]:
    """The tiles tried for one kernel: (rows per program, reduction chunk, warps), within a register
    budget per program (a larger tile spills and only costs compile time here)."""
    if kernel == "logits":
        return [(rows, 0, warps) for rows, warps in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8))]
    if kernel == "gate_up":
        chunks = sorted({min(c, 1 << (hidden - 1).bit_length()) for c in (512, 1024, 2048)})
        return [
            (rows, chunk, warps)
            for rows, chunk, warps in itertools.product((1, 2, 4, 8, 16), chunks, (4, 8))
            if rows * chunk <= 16384
        ]
    k_p2 = 1 << (top_k - 1).bit_length()
    chunks = sorted({min(c, 1 << (inter - 1).bit_length()) for c in (256, 512, 1024, 2048)})
    return [
        (rows, chunk, warps)
        for rows, chunk, warps in itertools.product((1, 2, 4, 8), chunks, (4, 8))
        if k_p2 * rows * chunk <= 32768
    ]


def replay_ms(run: Callable[[], Any]) -> float:
    """Device time of one replay of `run` captured as a graph (ms): median over batches of back-to-back
    replays. Without CUDA (`--cpu-interpreter`: the script's own check in Triton's interpreter) the
    wall time of a few eager runs, which says nothing of a GPU."""
    import torch

    if not torch.cuda.is_available():
        run()
        times = []
        for _ in range(3):
            started = time.perf_counter()
            run()
            times.append((time.perf_counter() - started) * 1000.0)
        return round(statistics.median(times), 5)
    run()  # warm-up (and Triton's compile), outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(BATCHES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(BATCH):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / BATCH)
    graph.reset()
    return round(statistics.median(times), 5)


def relative_error(got: Any, want: Any) -> float:
    return float((got.float() - want.float()).norm()) / max(float(want.float().norm()), 1e-12)


def kernel_times_us(run: Callable[[], Any], replays: int = 20) -> dict[str, float]:
    """Per kernel of one replay, its device time (us, torch profiler over `replays` graph replays)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for event in prof.key_averages():
        total = getattr(event, "self_device_time_total", None)
        if total is None:
            total = getattr(event, "self_cuda_time_total", 0.0)
        if total:
            out[event.key[:60]] = round(total / replays, 2)
    graph.reset()
    return out


def sweep_size(
    config: Any, view: Any, size: int, deadline: float, profile: bool, tiles_per_kernel: int | None = None
) -> dict[str, Any]:
    """One token count: default tiles, each kernel's tiles in turn (until `deadline`), the best found,
    and the other kernels of the bucket tuner."""
    import torch

    from engine_agent import direct_triton, moe, step_graphs

    device = view.router.device
    hidden, inter, top_k = config.hidden_size, config.intermediate_size, config.top_k
    default_tiles = dict(direct_triton.TILES)

    def with_kernel(kernel: str) -> Any:
        return step_graphs._with_kernel(view, kernel)  # type: ignore[arg-type]

    tokens = torch.randn(size, hidden, device=device)
    inputs = tokens.clone()
    valid, start, end = (torch.tensor(v, device=device) for v in (size, 0, size))
    experts, gate_weights = moe.route(config, view.router, tokens)
    direct_view = with_kernel("direct")
    assert direct_view.grouped is not None
    want = moe.grouped_share(config, direct_view.grouped, tokens, experts, gate_weights, valid=size)
    want_load = moe.own_load(config, experts, 0, size)
    # A padded bucket: the last token is padding, the first one's counts are another rank's.
    pad_valid = max(size - 1, 1)
    want_pad = moe.grouped_share(config, direct_view.grouped, tokens, experts, gate_weights, valid=pad_valid)
    want_pad_load = moe.own_load(config, experts[:pad_valid], min(1, pad_valid - 1), pad_valid)
    pad_counts = [torch.tensor(v, device=device) for v in (pad_valid, min(1, pad_valid - 1), pad_valid)]

    def direct_run() -> Any:
        assert direct_view.grouped is not None
        return direct_triton.direct_layer(
            config, view.router, direct_view.grouped, inputs, valid, (start, end)
        )

    def check() -> tuple[float, bool]:
        assert direct_view.grouped is not None
        out, load = direct_run()
        pad_out, pad_load = direct_triton.direct_layer(
            config,
            view.router,
            direct_view.grouped,
            inputs,
            pad_counts[0],
            (pad_counts[1], pad_counts[2]),
        )
        error = max(relative_error(out, want), relative_error(pad_out, want_pad) if size > 1 else 0.0)
        loads = torch.equal(load, want_load) and (size == 1 or torch.equal(pad_load, want_pad_load))
        return round(error, 6), bool(loads and torch.count_nonzero(pad_out[pad_valid:]) == 0)

    per_size: dict[str, Any] = {"tried": []}
    best = dict(default_tiles)
    direct_triton.TILES.update(default_tiles)
    try:
        error, loads_ok = check()
        per_size["default_ms"] = replay_ms(direct_run)
    except Exception as exc:  # the shipped tiles fail here: the sweep still says which would serve
        per_size["default_failed"] = repr(exc)[:300]
        error, loads_ok, per_size["default_ms"] = float("nan"), False, None
    per_size["default_error"], per_size["default_loads_ok"] = error, loads_ok
    print(
        f"size {size}: default {default_tiles} {per_size['default_ms']} ms err {error} loads {loads_ok}",
        flush=True,
    )
    out_of_time = False
    for kernel in ("logits", "gate_up", "down"):
        best_ms = None
        tried = [best[kernel], *(t for t in candidates(kernel, hidden, inter, top_k) if t != best[kernel])]
        for tile in tried[:tiles_per_kernel]:  # the tile held so far first: the best is never worse
            if time.monotonic() > deadline:
                out_of_time = True
                break
            direct_triton.TILES.update(best)
            direct_triton.TILES[kernel] = tile
            try:
                error, loads_ok = check()
                ms = replay_ms(direct_run)
            except Exception as exc:  # e.g. out of shared memory or registers for this tile
                per_size["tried"].append({"kernel": kernel, "tile": tile, "failed": repr(exc)[:200]})
                continue
            ok = error <= step_graphs.AGREE_REL_TOL and loads_ok
            per_size["tried"].append(
                {"kernel": kernel, "tile": tile, "ms": ms, "error": error, "loads_ok": loads_ok}
            )
            if ok and (best_ms is None or ms < best_ms):
                best_ms, best[kernel] = ms, tile
        print(f"size {size}: {kernel} best {best[kernel]} {best_ms} ms", flush=True)
    direct_triton.TILES.update(best)
    error, loads_ok = check()
    per_size["best_tiles"] = {k: list(v) for k, v in best.items()}
    per_size["best_ms"] = replay_ms(direct_run)
    per_size["best_error"], per_size["best_loads_ok"] = error, loads_ok
    per_size["complete"] = not out_of_time
    if profile:
        per_size["kernels_us_best"] = kernel_times_us(direct_run)
        direct_triton.TILES.update(default_tiles)
        per_size["kernels_us_default"] = kernel_times_us(direct_run)
    direct_triton.TILES.update(default_tiles)
    for kernel in ("grouped_mm", "padded"):
        other = with_kernel(kernel)

        def run(other: moe.LayerView = other) -> Any:
            return step_graphs.layer_step(config, other, 0, inputs, valid, (start, end), capacity=size)

        per_size[f"{kernel}_ms"] = replay_ms(run)
    return per_size


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1,16,4,2,8", help="token counts, in the order swept")
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=1408)
    parser.add_argument("--top-k", type=int, default=6)
    parser.add_argument(
        "--dtype", default="bfloat16", help="float16 for --cpu-interpreter (its bf16 casts truncate)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=300.0, help="stop sweeping past this (the rest: default tiles)"
    )
    parser.add_argument("--name", default="direct_sweep")
    parser.add_argument(
        "--cpu-interpreter",
        action="store_true",
        help="check this script on CPU in Triton's interpreter (two tiles a kernel; times meaningless)",
    )
    args = parser.parse_args(argv)
    if args.cpu_interpreter:
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is first imported
    import torch

    from engine_agent import moe
    from engine_agent.protocol import EngineConfig

    started = time.monotonic()
    config = EngineConfig(
        num_logical_experts=args.experts, hidden_size=args.hidden, intermediate_size=args.intermediate,
        top_k=args.top_k, dtype=args.dtype,
    )  # fmt: skip
    device = torch.device("cpu" if args.cpu_interpreter else "cuda:0")
    report = Report(args.name)
    report.parameters = vars(args)
    report.machine["gpu"] = (
        "none (Triton's interpreter)" if args.cpu_interpreter else torch.cuda.get_device_name(0)
    )
    report.machine["torch"] = torch.__version__
    import triton

    report.machine["triton"] = triton.__version__
    report.notes = [
        f"One {report.machine['gpu']} host ({os.cpu_count()} CPU cores), alone; load average at the start "
        f"{report.machine.get('loadavg_at_start')}. Times are device times (graph replays back to back)."
    ]
    placement = [list(range(args.experts))]
    weights, stacks = moe.stack_buffers(config, {0: placement[0]}, device)
    generator = torch.Generator(device=device).manual_seed(0)
    for stack in stacks.values():
        stack.buffer.normal_(0.0, 0.02, generator=generator)
    routers = [moe.router_weights(config, device, 0)]
    (view,) = moe.layer_views(config, [placement], weights, routers, device, rank=0, stacks=stacks)
    assert view.grouped is not None

    sizes = [int(s) for s in args.sizes.split(",")]
    bare = (
        {size: {"graph_ms": None} for size in sizes}
        if args.cpu_interpreter
        else gpu_step.bare_compute(config, device, sorted(sizes), reps=50)
    )
    report.results["bare_compute"] = bare
    results: dict[str, Any] = {}
    rows = []
    for size in sizes:
        try:
            per_size = sweep_size(
                config, view, size, started + args.budget_s,
                profile=size == sizes[0] and not args.cpu_interpreter,
                tiles_per_kernel=2 if args.cpu_interpreter else None,
            )  # fmt: skip
        except Exception as exc:  # reported, and the other sizes still run
            print(f"size {size} failed: {exc!r}", flush=True)
            results[str(size)] = {"failed": repr(exc)[:300]}
            continue
        results[str(size)] = per_size
        rows.append(
            [size, bare[size]["graph_ms"], per_size["default_ms"], per_size["best_ms"],
             " ".join(f"{k}={tuple(v)}" for k, v in per_size["best_tiles"].items()),
             per_size["best_error"], per_size["best_loads_ok"], per_size["grouped_mm_ms"],
             per_size["padded_ms"], per_size["complete"]]
        )  # fmt: skip
        report.results["sizes"] = results
        report.write()  # after each size: a run stopped later keeps what it measured
        print(f"size {size}: { ({k: v for k, v in per_size.items() if k != 'tried'}) }", flush=True)
    report.add_table(
        f"The direct kernel's tiles on one {report.machine['gpu']} (one layer, device ms per replay; "
        "tiles: (rows per program, reduction chunk, warps))",
        ["tokens", "bare compute", "direct, default tiles", "direct, best tiles", "best tiles",
         "rel. error vs torch form", "counts equal", "grouped matmul", "padded batch", "swept whole"],
        rows,
    )  # fmt: skip
    first = results.get(str(sizes[0]), {})
    if "kernels_us_best" in first:
        names = sorted(set(first["kernels_us_default"]) | set(first["kernels_us_best"]))
        report.add_table(
            f"Per kernel at {sizes[0]} token(s), us per replay (torch profiler)",
            ["kernel", "default tiles", "best tiles"],
            [[n, first["kernels_us_default"].get(n), first["kernels_us_best"].get(n)] for n in names],
        )
    report.results["seconds"] = round(time.monotonic() - started, 1)
    report.write()


if __name__ == "__main__":
    main()
