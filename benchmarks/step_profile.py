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
    parser.add_argument("--tokens", type=int, default=64)
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
    rows = []
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
            profile = profile_steps(engine, args.tokens, args.hidden, args.steps)
            report.results[f"profile_graphs_{graphs}"] = profile
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
    report.write()


if __name__ == "__main__":
    main()
