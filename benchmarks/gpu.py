"""Item 8: the agent on CUDA with NCCL, as far as one GPU allows.

Needs a CUDA device (exits with a message otherwise). Two parts, both real:

1. In-process costs of the building blocks the agent uses (`engine_agent.groups`, `engine_agent.moe`):
   NCCL group construction, its first all-reduce (the communicator is made there: the warm-up),
   a steady all-reduce, destruction; expert weight staging host -> device (pageable and pinned) and
   recomputing experts from the seed and moving them to the device ("the checkpoint", as the agent
   does for experts no engine holds).
2. One `epctl-agent --platform cuda` process driven through its HTTP API by the coordinator's own
   client (`app.agents.client.AgentClient`): formation (generation 0 -> 1, world 1), serving steps
   (`/v1/infer` latency), then 1 -> 1 reconfigurations (a new generation on the same
   GPU) for each strategy and warm-up policy, with the prepare step timeline (polled) and the commit
   window with its breakdown (`PauseInterval`).

    .venv/bin/python benchmarks/gpu.py                       # on a CUDA host
    .venv/bin/python benchmarks/gpu.py --reps 2 --experts 16 # smaller
    .venv/bin/python benchmarks/gpu.py --allow-cpu           # dry run of the script logic on CPU (gloo)

What one GPU cannot show: an EP group of several ranks (NCCL allows one rank per GPU), so no 2 -> 4
scaling, no cross-rank all-to-all and no device-to-device weight transfer between engines (NIXL over
NVLink/RDMA); those need a host with several GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import gpu_report
from common import (
    PYTHON,
    ProcessGroup,
    Report,
    scratch_dir,
    summarize,
    wait_ready_file,
)

# Coordinator-driven commits (pause, then switch) and the engine-agreed one ("armed": background
# strategy, `commit: engines`, what the coordinator uses for background jobs by default).
STRATEGIES = ("background", "armed", "blocking")

# The agent key of the agent this benchmark starts (EPCTL_AGENT_KEY), sent on every call to it.
AGENT_KEY = "epak_bench_" + secrets.token_urlsafe(24)


def microbenchmarks(args: argparse.Namespace, device_name: str, platform: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from engine_agent import groups, moe
    from engine_agent.protocol import EngineConfig, Platform

    device = torch.device(device_name)
    results: dict[str, Any] = {}
    store = groups.start_store_server("127.0.0.1", 30.0)
    construct, first, destroy = [], [], []
    steady: list[float] = []
    for generation in range(1, args.groups + 1):
        prefix = groups.prefixed(store, f"bench/{generation}/")
        t0 = time.perf_counter()
        group = groups.create_group(
            name="ep", generation=generation, store=prefix, rank=0, size=1,
            platform=Platform(platform), device=device, timeout_s=60.0,
        )  # fmt: skip
        t1 = time.perf_counter()
        groups.warm_up(group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        tensor = torch.ones(1, device=device)
        for _ in range(50):
            s = time.perf_counter()
            group.allreduce(tensor, dist.ReduceOp.SUM)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            steady.append((time.perf_counter() - s) * 1e6)
        t3 = time.perf_counter()
        groups.destroy_group(group)
        t4 = time.perf_counter()
        construct.append((t1 - t0) * 1000)
        first.append((t2 - t1) * 1000)
        destroy.append((t4 - t3) * 1000)
    results["group_construct_ms"] = construct
    results["group_first_allreduce_ms"] = first  # the first is cold (first communicator in the process)
    results["group_destroy_ms"] = destroy
    results["steady_allreduce_us"] = summarize(steady)

    config = EngineConfig(
        num_logical_experts=args.experts, hidden_size=args.hidden, intermediate_size=args.intermediate,
        top_k=args.top_k, dtype=args.dtype,
    )  # fmt: skip
    nbytes = moe.expert_nbytes(config)
    experts = min(args.experts, 16)
    host = [moe.expert_weights(config, e) for e in range(experts)]
    pinned = [t.pin_memory() for t in host] if device.type == "cuda" else host
    dst = [torch.empty_like(t, device=device) for t in host]

    def copy_all(source: list[Any]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        s = time.perf_counter()
        for d, h in zip(dst, source, strict=True):
            d.copy_(h, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - s

    copy_all(host)
    pageable = min(copy_all(host) for _ in range(3))
    pinned_s = min(copy_all(pinned) for _ in range(3))
    s = time.perf_counter()
    for e in range(experts):
        moe.expert_weights(config, e, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    recompute_s = time.perf_counter() - s
    total = nbytes * experts
    results["staging"] = {
        "expert_bytes": nbytes,
        "experts_copied": experts,
        "bytes": total,
        "h2d_pageable_gib_s": round(total / pageable / 2**30, 2),
        "h2d_pinned_gib_s": round(total / pinned_s / 2**30, 2),
        "recompute_to_device_ms_per_expert": round(recompute_s / experts * 1000, 2),
        "stage_all_experts_pinned_ms": round(nbytes * args.experts / (total / pinned_s) * 1000, 2),
    }
    return results


# ---------------------------------------------------------------------------------------------------
# the agent through its HTTP API


async def poll_timeline(
    client: Any, job_id: str, stop: asyncio.Event, out: list[tuple[float, str, str]]
) -> None:
    """Record (time, phase, step) whenever the agent's status changes (polled every 2 ms)."""
    last: tuple[str, str] | None = None
    while not stop.is_set():
        try:
            status = await client.reconfig(timeout_s=5.0)
        except Exception:
            status = None
        if status is not None and status.job_id == job_id:
            now = (status.phase.value, status.step or "")
            if now != last:
                out.append((time.perf_counter(), *now))
                last = now
        await asyncio.sleep(0.002)


def step_durations(timeline: list[tuple[float, str, str]], end: float) -> dict[str, float]:
    durations: dict[str, float] = {}
    if not timeline:  # prepare was done before the first poll saw it (a small model on a fast host)
        return durations
    for (t, phase, step), nxt in zip(timeline, [*timeline[1:], (end, "", "")], strict=True):
        key = f"{phase}:{step}" if step else phase
        durations[key] = durations.get(key, 0.0) + (nxt[0] - t) * 1000.0
    return {k: round(v, 2) for k, v in durations.items()}


async def reconfigure(
    client: Any, info: Any, *, generation: int, old: bool, strategy: str, policy: str, backend: str
) -> dict[str, Any]:
    from engine_agent.protocol import (
        Member,
        PrepareRequest,
        ReconfigPhase,
        Strategy,
        TransferBackend,
        WarmupPolicy,
    )

    me = Member(engine_id=info.engine_id, url=info.url)
    placement = [list(range(info.engine.num_logical_experts + info.engine.num_redundant_experts))]
    placement = [[e % info.engine.num_logical_experts for e in placement[0]]]
    job_id = f"gpu-{uuid.uuid4().hex[:8]}"
    request = PrepareRequest(
        job_id=job_id,
        generation=generation,
        old_generation=generation - 1,
        members=[me],
        old_members=[me] if old else [],
        old_placement=info.placement if old else [],
        placement=placement,
        store=info.store,
        warmup_policy=WarmupPolicy(policy),
        strategy=Strategy.background if strategy == "armed" else Strategy(strategy),
        transfer_backend=TransferBackend(backend),
    )
    timeline: list[tuple[float, str, str]] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(poll_timeline(client, job_id, stop, timeline))
    t0 = time.perf_counter()
    deadline = 600.0
    await client.prepare(request)
    await client.wait_for_phase(job_id, {ReconfigPhase.prepared}, deadline_s=deadline, poll_interval_s=0.003)
    t_prepared = time.perf_counter()
    # The timeline is prepare's: its 2 ms status polls would load the agent's event loop (and the GIL
    # the serving loop needs) inside the window it measures.
    stop.set()
    await watcher
    if strategy == "armed":  # the engine-agreed commit: the product's default for background jobs
        await client.sync(job_id)
        await client.wait_for_phase(
            job_id, {ReconfigPhase.synced}, deadline_s=deadline, poll_interval_s=0.003
        )
        t_commit = time.perf_counter()
        await client.arm(job_id, deadline_s=30.0)
    elif strategy == "background":
        await client.sync(job_id)
        await client.wait_for_phase(
            job_id, {ReconfigPhase.synced}, deadline_s=deadline, poll_interval_s=0.003
        )
        t_commit = time.perf_counter()
        await client.pause(job_id)
        await client.wait_for_phase(
            job_id, {ReconfigPhase.paused}, deadline_s=deadline, poll_interval_s=0.003
        )
    else:
        t_commit = time.perf_counter()
        await client.pause(job_id)
        await client.wait_for_phase(
            job_id, {ReconfigPhase.paused}, deadline_s=deadline, poll_interval_s=0.003
        )
        await client.sync(job_id)
        await client.wait_for_phase(
            job_id, {ReconfigPhase.synced}, deadline_s=deadline, poll_interval_s=0.003
        )
    if strategy != "armed":
        await client.switch(job_id)
    final = await client.wait_for_phase(
        job_id, {ReconfigPhase.committed}, deadline_s=deadline, poll_interval_s=0.003
    )
    t_end = time.perf_counter()
    pause = final.pause.model_dump() if final.pause else {}
    return {
        "graphs": final.graphs.model_dump() if final.graphs else None,
        "job_id": job_id,
        "generation": generation,
        "strategy": strategy,
        "policy": policy,
        "prepare_ms": (t_prepared - t0) * 1000,
        "commit_seen_by_client_ms": (t_end - t_commit) * 1000,
        "total_ms": (t_end - t0) * 1000,
        "commit_window_ms": pause.get("pause_ms"),
        "pause": pause,
        "steps_ms": step_durations(timeline, t_prepared),
    }


async def drive_agent(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from app.agents.client import AgentClient
    from engine_agent.protocol import TransferBackend

    out: dict[str, Any] = {"jobs": []}
    async with AgentClient("gpu-0", url, timeout_s=60.0, keys=(AGENT_KEY,)) as client:
        info = await client.info()
        backend = (
            TransferBackend.nixl if TransferBackend.nixl in info.transfer_backends else TransferBackend.gloo
        )
        out["agent"] = {
            "platform": info.platform.value,
            "device": info.device,
            "transfer_backend": backend.value,
        }
        formation = await reconfigure(
            client,
            info,
            generation=1,
            old=False,
            strategy="background",
            policy="eager",
            backend=backend.value,
        )
        out["formation"] = formation
        print(f"formation 0 -> 1: prepare {formation['prepare_ms']:.0f} ms, steps {formation['steps_ms']}")

        # Serving: /v1/infer latency through HTTP, and the idle step rate (dummy steps with no requests).
        import torch

        from engine_agent import tensor_wire

        batch = torch.randn(args.infer_tokens, args.hidden)
        tokens = batch.tolist()
        binary = tensor_wire.encode("float32", tuple(batch.shape), batch.numpy().tobytes())
        latencies: list[float] = []
        binary_latencies: list[float] = []
        async with httpx.AsyncClient(timeout=60.0) as http:
            for _ in range(args.infer_requests):  # both forms, interleaved
                s = time.perf_counter()
                response = await http.post(f"{url}/v1/infer", json={"tokens": tokens})
                response.raise_for_status()
                latencies.append((time.perf_counter() - s) * 1000)
                s = time.perf_counter()
                response = await http.post(
                    f"{url}/v1/infer", content=binary, headers={"content-type": tensor_wire.MEDIA_TYPE}
                )
                response.raise_for_status()
                binary_latencies.append((time.perf_counter() - s) * 1000)
        out["serving"] = {
            "infer_tokens": args.infer_tokens,
            "infer_latency_ms": summarize(latencies),
            "infer_binary_latency_ms": summarize(binary_latencies),
            "serving_steps": (await client.info()).serving_steps,
        }
        generation = 2
        for rep in range(args.reps):
            for strategy in STRATEGIES:
                for policy in ("eager", "deferred"):
                    info = await client.info()
                    job = await reconfigure(
                        client, info, generation=generation, old=True, strategy=strategy, policy=policy,
                        backend=backend.value,
                    )  # fmt: skip
                    job["rep"] = rep
                    generation += 1
                    out["jobs"].append(job)
                    print(
                        f"1 -> 1 {strategy:10} {policy:8}: prepare {job['prepare_ms']:7.1f} ms, "
                        f"commit window {job['commit_window_ms'] or 0:7.1f} ms",
                        flush=True,
                    )
    return out


def step_part(args: argparse.Namespace, device_name: str) -> dict[str, Any]:
    """The bare compute and the engine's step per token count, graphs off and on (`gpu_step`)."""
    import gpu_step
    import torch

    from engine_agent.protocol import EngineConfig

    config = EngineConfig(
        num_logical_experts=args.experts, hidden_size=args.hidden, intermediate_size=args.intermediate,
        top_k=args.top_k, dtype=args.dtype,
    )  # fmt: skip
    device = torch.device(device_name)
    out: dict[str, Any] = {"bare": gpu_step.bare_compute(config, device, args.step_sizes, reps=50)}
    for mode in args.cuda_graphs:
        out[mode] = gpu_step.engine_steps(
            config, device, graphs=mode != "off", buckets=args.graph_buckets, sizes=args.step_sizes,
            requests=args.step_requests,
        )  # fmt: skip
        print(f"engine step, graphs {mode}: {out[mode]['steps_ms']}", flush=True)
    print(f"bare compute: {out['bare']}", flush=True)
    return out


def run_agent(
    args: argparse.Namespace, platform: str, device: str, on_gpu: bool, mode: str
) -> dict[str, Any]:
    """One agent with `--cuda-graphs mode`, driven through its API (`drive_agent`)."""
    scratch = scratch_dir(f"gpu-{mode}")
    ready = scratch / "agent.ready"
    ready.unlink(missing_ok=True)
    with ProcessGroup(scratch) as group:
        argv_agent = [
            PYTHON, "-m", "engine_agent.main", "--port", "0", "--ready-file", str(ready),
            "--engine-id", "gpu-0",
            "--platform", platform, *(["--device", device] if on_gpu else []),
            "--num-logical-experts", str(args.experts), "--hidden-size", str(args.hidden),
            "--intermediate-size", str(args.intermediate), "--top-k", str(args.top_k), "--dtype", args.dtype,
            "--grouped-step", args.grouped_step,
            "--cuda-graphs", mode if on_gpu else "off",
            "--cuda-graph-buckets", ",".join(map(str, args.graph_buckets)),
        ]  # fmt: skip
        agent = group.start("agent", argv_agent, env={"EPCTL_AGENT_KEY": AGENT_KEY})
        url = wait_ready_file(ready, agent, timeout_s=300)
        driven = asyncio.run(drive_agent(url, args))
    driven["cuda_graphs"] = mode
    return driven


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experts", type=int, default=64, help="DeepSeek-V2-Lite-like shapes by default")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=1408)
    parser.add_argument("--top-k", type=int, default=6)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4, help="NCCL groups built in the micro part")
    parser.add_argument("--infer-requests", type=int, default=50)
    parser.add_argument("--infer-tokens", type=int, default=64)
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on CPU/gloo (checks the script)")
    parser.add_argument(
        "--grouped-step", choices=["auto", "on", "off"], default="auto", help="the agent's --grouped-step"
    )
    parser.add_argument(
        "--cuda-graphs", nargs="+", choices=["off", "on", "auto"], default=["off", "on"],
        help="the agent's --cuda-graphs: one agent (and one engine step run) per value, in this order",
    )  # fmt: skip
    parser.add_argument(
        "--graph-buckets", type=lambda text: [int(v) for v in text.split(",")],
        default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], help="token counts with a graph (comma-separated)",
    )  # fmt: skip
    parser.add_argument("--step-sizes", type=int, nargs="+", default=[1, 8, 64, 512])
    parser.add_argument("--step-requests", type=int, default=30, help="timed steps per size")
    parser.add_argument("--name", help="results file name (default gpu, or gpu-dryrun-cpu)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            "benchmarks/gpu.py needs a CUDA device (torch.cuda.is_available() is False here); "
            "run it on the GPU host, or pass --allow-cpu for a dry run of the script on CPU.",
            file=sys.stderr,
        )
        sys.exit(2)
    on_gpu = torch.cuda.is_available()
    platform, device = ("cuda", "cuda:0") if on_gpu else ("cpu", "cpu")

    report = Report(args.name or ("gpu" if on_gpu else "gpu-dryrun-cpu"))
    report.parameters = vars(args) | {"platform": platform, "device": device}
    if on_gpu:
        report.machine["gpu"] = torch.cuda.get_device_name(0)
        report.machine["torch"] = torch.__version__
        report.machine["cuda"] = torch.version.cuda
        nccl = torch.cuda.nccl.version()
        report.machine["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    micro = microbenchmarks(args, device, platform)
    report.results["micro"] = micro

    if on_gpu:
        report.results["step"] = step_part(args, device)
    driven_by_mode = {mode: run_agent(args, platform, device, on_gpu, mode) for mode in args.cuda_graphs}
    report.results["agent_by_graphs"] = driven_by_mode
    driven = driven_by_mode[args.cuda_graphs[-1]]
    report.results["agent"] = driven

    report.add_table(
        f"NCCL/{platform} groups of world 1 ({device})",
        ["generation", "construct ms", "first all-reduce (warm-up) ms", "destroy ms"],
        [
            [i + 1, c, f, d]
            for i, (c, f, d) in enumerate(
                zip(
                    micro["group_construct_ms"],
                    micro["group_first_allreduce_ms"],
                    micro["group_destroy_ms"],
                    strict=True,
                )
            )
        ],
    )
    st = micro["staging"]
    report.add_table(
        "Expert weight staging",
        ["expert MiB", "H2D pageable GiB/s", "H2D pinned GiB/s", "recompute (CPU RNG) + to device ms/expert",
         "all experts pinned ms", "steady all-reduce us p50"],
        [[round(st["expert_bytes"] / 2**20, 2), st["h2d_pageable_gib_s"], st["h2d_pinned_gib_s"],
          st["recompute_to_device_ms_per_expert"], st["stage_all_experts_pinned_ms"],
          micro["steady_allreduce_us"]["p50"]]],
    )  # fmt: skip
    gpu_report.agent_tables(report, args, driven_by_mode, device)
    if "step" in report.results:
        gpu_report.step_tables(report, args, report.results["step"], driven_by_mode)
    report.notes.append(
        "One GPU holds one NCCL rank: EP groups of several ranks (2 -> 4 scaling, all-to-all, "
        "device-to-device weight transfer between engines over NIXL) need a host with several GPUs."
    )
    gpu_report.window_figure(report, driven_by_mode, device)
    report.targets_table()
    report.write()


if __name__ == "__main__":
    main()
