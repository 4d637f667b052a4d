"""Where one serving step and one commit window spend their time on a GPU, in-process: the torch
profiler over steps of the reference engine (graphs off and on), and the engine's own pause, switch
and first step timed from the host. A diagnosis for `gpu.py`'s figures, not a benchmark with targets.

    .venv/bin/python benchmarks/step_profile.py --tokens 64        # on a CUDA host
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import gpu_step
from common import Report, summarize


def profile_steps(engine: Any, tokens: int, hidden: int, steps: int) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    batch = torch.randn(tokens, hidden)
    for _ in range(10):
        engine.submit(batch).result(timeout=60)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.submit(batch).result(timeout=60)
    table: str = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    cuda: str = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15)
    return table + "\n" + cuda


def step_parts(engine: Any, group: Any, config: Any, sizes: list[int], reps: int) -> dict[int, Any]:
    """Per token count, the parts of one serving step timed one by one from the host (ms p50), with
    the engine paused so this thread holds its generation: the tokens' copy to the device (the
    request's `submit`, outside the step's timer), the step's compute through the layers (graph
    replay where a bucket holds it) and its wait for the device, the outputs' copy back, and that
    replay's device time alone (CUDA events); beside them the engine's own step p50 and what a
    control all-reduce costs (a member of several pays it every step; a one-member group's is the
    identity and no longer runs)."""
    import torch

    from engine_agent import lockstep

    device = engine.device
    out: dict[int, Any] = {}
    for size in sizes:
        tokens = torch.randn(size, config.hidden_size)
        for _ in range(5):
            engine.submit(tokens).result(timeout=60)
        seen = len(engine.step_times_ms())
        for _ in range(reps):
            engine.submit(tokens).result(timeout=60)
        step = engine.step_times_ms()[seen:]
        engine.pause(10.0)
        try:
            active, layers = engine.active, engine._layers
            keys = ("h2d", "compute", "to_host", "control", "replay_gpu")
            parts: dict[str, list[float]] = {k: [] for k in keys}
            for _ in range(reps + 5):
                torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                staged = engine._to_device(tokens)
                torch.cuda.synchronize(device)
                t1 = time.perf_counter()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                rows, _, _ = lockstep.moe_step(
                    config, group, layers, staged, [size], device, None, active.graphs
                )
                end.record()
                torch.cuda.synchronize(device)
                t2 = time.perf_counter()
                engine._to_host(rows, group, None)
                t3 = time.perf_counter()
                control = torch.tensor([0, 0, 0, 0, size], dtype=torch.int64).to(device)
                group.allreduce(control).tolist()
                t4 = time.perf_counter()
                for key, value in zip(
                    keys,
                    (t1 - t0, t2 - t1, t3 - t2, t4 - t3, start.elapsed_time(end) / 1000.0), strict=True,
                ):  # fmt: skip
                    parts[key].append(value * 1000.0)
        finally:
            engine.resume()
            engine.wait_serving(10.0)
        out[size] = {"engine_step_ms": summarize(step)} | {
            f"{key}_ms": summarize(values[5:]) for key, values in parts.items()
        }
    return out


def window_parts(engine: Any, group: Any, reps: int) -> dict[str, Any]:
    """pause() on an idle engine (to its boundary), then resume() to its first iteration done."""
    pause_ms, first_step_ms = [], []
    for _ in range(reps):
        time.sleep(0.05)
        started = time.perf_counter()
        engine.pause(10.0)
        pause_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        engine.resume()
        engine.wait_serving(10.0)
        first_step_ms.append((time.perf_counter() - started) * 1000)
    return {"pause_to_boundary_ms": summarize(pause_ms), "resume_to_first_step_ms": summarize(first_step_ms)}


def window_parts_under_python_load(engine: Any, group: Any, reps: int) -> dict[str, Any]:
    """The same, while another thread runs Python without pause (an HTTP server answering polls holds
    the GIL so), at the interpreter's default switch interval (5 ms) and at 0.5 ms."""
    import sys
    import threading

    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(i * i for i in range(2000))

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    out: dict[str, Any] = {}
    default = sys.getswitchinterval()
    try:
        for interval in (default, 0.0005):
            sys.setswitchinterval(interval)
            out[f"switch_interval_{interval * 1000:g}ms"] = window_parts(engine, group, reps)
    finally:
        sys.setswitchinterval(default)
        stop.set()
        thread.join()
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=64, help="the torch profiler's steps' token count")
    parser.add_argument("--part-sizes", default="1,8,64", help="token counts of the per-part step timing")
    parser.add_argument("--part-reps", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=1408)
    parser.add_argument("--top-k", type=int, default=6)
    parser.add_argument("--buckets", default="1,8,64,512")
    parser.add_argument("--name", default="step_profile")
    args = parser.parse_args(argv)
    import torch

    from engine_agent.protocol import EngineConfig

    config = EngineConfig(
        num_logical_experts=args.experts, hidden_size=args.hidden, intermediate_size=args.intermediate,
        top_k=args.top_k, dtype="bfloat16",
    )  # fmt: skip
    device = torch.device("cuda:0")
    buckets = [int(b) for b in args.buckets.split(",")]
    report = Report(args.name)
    report.parameters = vars(args)
    rows, part_rows = [], []
    sizes = [int(n) for n in args.part_sizes.split(",")]
    bare = gpu_step.bare_compute(config, device, sizes, reps=50)
    report.results["bare_compute"] = bare
    for graphs in (False, True):
        with gpu_step.serving_engine(config, device, graphs=graphs, buckets=buckets, name="profile") as (
            engine, group, cost,
        ):  # fmt: skip
            parts = window_parts(engine, group, reps=20)
            report.results[f"window_graphs_{graphs}"] = parts
            loaded = window_parts_under_python_load(engine, group, reps=20)
            report.results[f"window_loaded_graphs_{graphs}"] = loaded
            print(f"--- graphs {graphs}, another thread busy in Python: {loaded}", flush=True)
            report.results[f"cost_graphs_{graphs}"] = cost
            steps = step_parts(engine, group, config, sizes, args.part_reps)
            report.results[f"step_parts_graphs_{graphs}"] = steps
            for size, p in steps.items():
                p50 = {key: value["p50"] for key, value in p.items()}
                part_rows.append(
                    [graphs, size, bare[size]["graph_ms"], p50["engine_step_ms"], p50["replay_gpu_ms"],
                     p50["compute_ms"], p50["to_host_ms"], p50["h2d_ms"], p50["control_ms"],
                     round(p50["engine_step_ms"] / bare[size]["graph_ms"], 2)]
                )  # fmt: skip
            print(f"--- graphs {graphs}, step parts: {steps}", flush=True)
            profile = profile_steps(engine, args.tokens, args.hidden, args.steps)
            report.results[f"profile_graphs_{graphs}"] = profile
            one = profile_steps(engine, 1, args.hidden, args.steps)
            report.results[f"profile_graphs_{graphs}_tokens1"] = one
            print(f"--- graphs {graphs}: {parts} {cost}\n{profile}", flush=True)
            rows.append(
                [graphs, parts["pause_to_boundary_ms"]["p50"], parts["resume_to_first_step_ms"]["p50"],
                 cost.get("kernels")]
            )  # fmt: skip
    report.add_table(
        "An idle engine's pause and resume (host-timed, in-process; ms p50)",
        ["graphs", "pause to boundary", "resume to first step done", "kernels per bucket"],
        rows,
    )
    report.add_table(
        "One step's parts, host-timed with the engine paused (ms p50): the step's compute is the layers "
        "queued and waited for; replay (GPU) its device time alone (CUDA events)",
        ["graphs", "tokens", "bare compute (graph)", "engine step", "step compute (GPU)",
         "step compute + wait (host)", "outputs to host", "tokens to device (submit)",
         "a control all-reduce (not run at world 1)", "step / bare"],
        part_rows,
    )  # fmt: skip
    report.write()


if __name__ == "__main__":
    main()
