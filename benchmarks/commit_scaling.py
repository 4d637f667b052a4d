"""Issue 9: the commit window against fleet size, with real engines, both commit modes side by side.

Real agent processes (`engine_agent.main`, the reference MoE engine, gloo on CPU) driven by the
coordinator's own fan-out code (`app.backends.reference.fanout.Fanout.drive` over its `Fleet` /
aiohttp `AgentClient`, the runner's deadlines and poll intervals), step for step as
`app.backends.reference.flow` does:

    coordinator: prepare -> sync -> pause -> switch   (two exchanges inside the stopped window)
    engines:     prepare -> sync -> arm               (the engines agree on the boundary themselves)

For each fleet size N (default 2, 4, 8) the engines first form a generation of N, then every round
rebuilds it N -> N (a new generation over the same engines: new groups, a new placement, the whole
commit) once per mode, the modes in a shuffled order. Figures per job, from the agents' own reports:
the window (union of the engines' pause intervals, first pause to last resume), the longest engine's
own work inside it (switch + resume + deferred warm-up), and the coordinator's time inside it: in
`coordinator` mode from the last engine stopping to the switch going out (the pause confirmation and
the decision), in `engines` mode 0 by construction (nothing is sent once the engines are armed; the
figure is reported from the same clocks: the arm went out before the first engine stopped).

    .venv/bin/python benchmarks/commit_scaling.py                    # 2, 4, 8 engines, 8 rounds
    .venv/bin/python benchmarks/commit_scaling.py --sizes 2 4 --rounds 3

The floor beside it (issue 37 item 3, `--floor-iters`, after the agents are stopped, on the same
cores): N plain processes in one gloo group making the serving loop's control all-reduce (CONTROL_SLOTS
+ N int64, `engine_agent.lockstep.agree_boundary`) back to back in lock-step; one such collective is
what the window cannot go under at N (the engines agree the boundary with it, and resume with it).

Targets: window at the largest size <= 1.3x the window at the smallest (engines mode); the window less
the collective floor, largest over smallest, <= 1.3x; the coordinator's time inside the window in
engines mode: 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from typing import Any

from common import NOISE_NOTE, PYTHON, ROOT, Report, new_figure, save_figure, scratch_dir, summarize

from app.agents.client import AgentClient
from app.agents.fleet import Fleet
from app.backends.reference.fanout import Fanout
from app.backends.reference.job import JobRun
from app.core.runner_settings import RunnerSettings
from app.jobs.states import JobState
from engine_agent.engine_options import engine_args
from engine_agent.lockstep import CONTROL_SLOTS
from engine_agent.placement import rebalance
from engine_agent.protocol import (
    CommitMode,
    EngineConfig,
    Member,
    PrepareRequest,
    ReconfigPhase,
    StoreAddress,
    Strategy,
    Timeouts,
    TransferBackend,
    WarmupPolicy,
)
from tests.support.processes import AGENT_KEY, StartedAgent, start_agents

CONFIG = EngineConfig(
    num_logical_experts=16, num_redundant_experts=0, hidden_size=64, intermediate_size=128, top_k=2, seed=3
)
TIMEOUTS = Timeouts(rendezvous_s=60.0, collective_s=60.0, transfer_s=60.0, pause_lease_s=60.0)


class Fleetwide:
    """The engines, the generation they serve, and the coordinator's client to each."""

    def __init__(self, agents: Sequence[StartedAgent], fanout: Fanout, store: StoreAddress) -> None:
        self.agents = list(agents)
        self.fanout = fanout
        self.store = store
        self.generation = 0
        self.members: list[Member] = []
        self.placement: list[list[int]] = []

    def clients(self, members: Sequence[Member]) -> list[AgentClient]:
        return [self.fanout.fleet.client(m.engine_id, m.url) for m in members]

    async def job(self, size: int, mode: CommitMode, policy: WarmupPolicy) -> dict[str, float]:
        """One job from the current generation to one of `size` engines; its figures."""
        settings = self.fanout.settings
        members = [Member(engine_id=a.engine_id, url=a.url) for a in self.agents[:size]]
        job_id = f"scaling-{uuid.uuid4().hex[:8]}"
        request = PrepareRequest(
            job_id=job_id,
            generation=self.generation + 1,
            old_generation=self.generation,
            members=members,
            old_members=self.members,
            old_placement=self.placement,
            placement=rebalance([1.0] * CONFIG.num_logical_experts, 0, size, num_logical=16),
            store=self.store,
            warmup_policy=policy,
            strategy=Strategy.background,
            transfer_backend=TransferBackend.gloo,
            timeouts=TIMEOUTS,
        )
        run = JobRun(
            job_id=job_id,
            deployment_id="bench",
            deployment_name="bench",
            launcher_name="static",
            engine_config=CONFIG,
            state=JobState.preparing,
            strategy=Strategy.background,
            warmup_requested=policy.value,
            commit_mode=mode,
        )
        old_ids = {m.engine_id for m in self.members}
        everyone = self.clients([*self.members, *(m for m in members if m.engine_id not in old_ids)])
        slow, fast = settings.agent_poll_interval_s, settings.commit_poll_interval_s

        async def step(send: Any, want: ReconfigPhase, poll: float, deadline_s: float = 120.0) -> None:
            await self.fanout.drive(
                run,
                everyone,
                {want},
                send=send,
                job_phase="bench",
                deadline_s=deadline_s,
                poll_interval_s=poll,
            )

        await step(lambda c, w: c.prepare(request, wait_s=w), ReconfigPhase.prepared, slow)
        await step(lambda c, w: c.sync(job_id, wait_s=w), ReconfigPhase.synced, slow)
        sent: dict[str, float] = {}
        if mode == CommitMode.coordinator:
            await step(
                lambda c, w: c.pause(job_id, lease_s=settings.pause_lease_s, wait_s=w),
                ReconfigPhase.paused,
                fast,
            )
            sent["switch"] = time.time()
            await step(lambda c, w: c.switch(job_id, wait_s=w), ReconfigPhase.committed, fast)
        else:
            sent["arm"] = time.time()
            await step(
                lambda c, w: c.arm(job_id, deadline_s=60.0, lease_s=settings.pause_lease_s, wait_s=w),
                ReconfigPhase.committed,
                fast,
            )
        self.generation, self.members, self.placement = request.generation, members, request.placement
        return figures(run, old_ids, sent)


def figures(run: JobRun, old_ids: set[str], sent: dict[str, float]) -> dict[str, float]:
    pauses = [s.pause for e, s in run.statuses.items() if e in old_ids and s.pause is not None]
    if not pauses:
        return {}
    first = min(p.paused_at for p in pauses)
    last_stop = max(p.paused_at for p in pauses)
    last_resume = max(p.resumed_at or p.paused_at for p in pauses)
    work = max(p.warmup_ms + p.switch_ms + p.resume_ms for p in pauses)
    if "switch" in sent:
        inside = max(0.0, (sent["switch"] - last_stop) * 1000.0)
    else:
        inside = max(0.0, (sent["arm"] - first) * 1000.0)  # > 0 only if the arm went out after a stop
    window = (last_resume - first) * 1000.0
    first_resume = min(p.resumed_at or p.paused_at for p in pauses)
    return {
        "window_ms": window,
        "engine_work_ms": work,
        "coordinator_inside_ms": inside,
        "rest_ms": max(0.0, window - work - inside),
        "stop_skew_ms": (last_stop - first) * 1000.0,
        # The window's parts (issue 37 item 3): first stop -> last stop (the skew) + last stop -> last
        # resume; inside the engines, the longest switch and resume; the resumes' own spread.
        "after_last_stop_ms": (last_resume - last_stop) * 1000.0,
        "switch_max_ms": max(p.switch_ms for p in pauses),
        "resume_max_ms": max(p.resume_ms for p in pauses),
        "resume_skew_ms": (last_resume - first_resume) * 1000.0,
    }


async def measure(
    agents: Sequence[StartedAgent], sizes: Sequence[int], rounds: int, policy: WarmupPolicy
) -> dict[tuple[int, str], dict[str, list[float]]]:
    samples: dict[tuple[int, str], dict[str, list[float]]] = {}
    rng = random.Random(9)
    async with Fleet(timeout_s=30.0, keys=(AGENT_KEY,)) as fleet:
        fanout = Fanout(fleet, RunnerSettings())
        store = (await fleet.client(agents[0].engine_id, agents[0].url).info()).store
        fleetwide = Fleetwide(agents, fanout, store)
        for size in sizes:
            await fleetwide.job(size, CommitMode.engines, policy)  # form (or resize to) this size
            await fleetwide.job(size, CommitMode.coordinator, policy)  # warm both paths once
            for _ in range(rounds):
                modes = [CommitMode.coordinator, CommitMode.engines]
                rng.shuffle(modes)
                for mode in modes:
                    result = await fleetwide.job(size, mode, policy)
                    bucket = samples.setdefault((size, mode.value), {})
                    for key, value in result.items():
                        bucket.setdefault(key, []).append(value)
            print(f"{size} engines done", flush=True)
    return samples


# One rank of the floor: the control all-reduce (int64, CONTROL_SLOTS + N) back to back; per-call times.
FLOOR_RANK = """
import json, sys, time
import torch, torch.distributed as dist
rank, size, port, iters, slots = (int(a) for a in sys.argv[1:6])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
values = torch.zeros(slots + size, dtype=torch.int64)
for _ in range(50):
    dist.all_reduce(values)
dist.barrier()
times = []
for _ in range(iters):
    t0 = time.perf_counter()
    dist.all_reduce(torch.tensor([1, 0, 0, 0] + [rank] * size, dtype=torch.int64))
    times.append((time.perf_counter() - t0) * 1000.0)
dist.barrier()
dist.destroy_process_group()
print(json.dumps(times))
"""


def collective_floor(size: int, iters: int) -> dict[str, float]:
    """One lock-step control all-reduce across `size` processes (gloo, loopback): the per-call time,
    over every rank's calls (a rank that enters first waits for the last: that is the lock-step)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [PYTHON, "-c", FLOOR_RANK, str(r), str(size), str(port), str(iters), str(CONTROL_SLOTS)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in range(size)
    ]
    per_call: list[float] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"floor rank exited with {proc.returncode}")
        per_call.extend(json.loads(out))
    return summarize(per_call)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--policy", choices=[p.value for p in WarmupPolicy], default="eager")
    parser.add_argument("--name", default="commit_scaling", help="results file name")
    parser.add_argument(
        "--floor-iters", type=int, default=500, help="lock-step control all-reduces per size (0: no floor)"
    )
    args = parser.parse_args(argv)
    sizes = sorted(set(args.sizes))
    report = Report(args.name)
    report.parameters = vars(args) | {
        "driver": "app.backends.reference.fanout.Fanout.drive over Fleet / AgentClient (aiohttp), "
        "real agents",
        "engine": CONFIG.model_dump(),
        "cpu_count": os.cpu_count(),
    }
    workdir = scratch_dir("commit_scaling")
    started = start_agents(
        [f"c{i}" for i in range(sizes[-1])],
        workdir,
        flags={"platform": "cpu", "log_level": "warning"},
        engine_args=engine_args(CONFIG),
        ready_timeout_s=180.0,
    )
    try:
        samples = asyncio.run(measure(started, sizes, args.rounds, WarmupPolicy(args.policy)))
    finally:
        for agent in started:
            agent.child.kill()
    floor: dict[int, dict[str, float]] = {}
    if args.floor_iters > 0:
        for agent in started:
            agent.child.popen.wait(timeout=30)
        floor = {size: collective_floor(size, args.floor_iters) for size in sizes}
        report.results["collective_floor_ms"] = {str(n): f for n, f in floor.items()}
        report.add_table(
            f"The floor: one lock-step control all-reduce ({CONTROL_SLOTS} + N int64, gloo) across N "
            f"processes, {args.floor_iters} calls per rank (ms per call)",
            ["processes", "p50", "p99", "mean"],
            [[n, f["p50"], f["p99"], f["mean"]] for n, f in floor.items()],
        )
    rows = []
    for size in sizes:
        for mode in ("coordinator", "engines"):
            stats = {k: summarize(v) for k, v in samples.get((size, mode), {}).items()}
            if stats:
                rows.append({"engines": size, "commit": mode, **stats})
    report.results["rows"] = rows
    report.add_table(
        f"Commit window vs fleet size, real engines ({args.rounds} jobs per size and mode, N -> N, "
        f"{args.policy} warm-up, ms)",
        ["engines", "commit", "window p50", "window p99", "coordinator inside p50", "engine work p50",
         "rest p50", "stop skew p50"],
        [
            [r["engines"], r["commit"], r["window_ms"]["p50"], r["window_ms"]["p99"],
             r["coordinator_inside_ms"]["p50"], r["engine_work_ms"]["p50"], r["rest_ms"]["p50"],
             r["stop_skew_ms"]["p50"]]
            for r in rows
        ],
    )  # fmt: skip
    engines = {r["engines"]: r for r in rows if r["commit"] == "engines"}
    coordinator = {r["engines"]: r for r in rows if r["commit"] == "coordinator"}
    small, large = sizes[0], sizes[-1]
    if small in engines and large in engines and small != large:
        ratio = engines[large]["window_ms"]["p50"] / engines[small]["window_ms"]["p50"]
        report.results["engines_window_ratio"] = round(ratio, 3)
        report.target(f"engines mode: window at {large} / at {small} engines (p50)", ratio, 1.3, "x")
        if small in floor and large in floor:
            above = {n: engines[n]["window_ms"]["p50"] - floor[n]["p50"] for n in sizes if n in engines}
            report.results["engines_window_above_floor_ms"] = {str(n): round(v, 3) for n, v in above.items()}
            report.add_table(
                "Engines mode: the window against the collective floor (p50 ms)",
                ["engines", "window", "floor", "window - floor", "x of smallest"],
                [
                    [n, engines[n]["window_ms"]["p50"], floor[n]["p50"], v, v / above[small]]
                    for n, v in above.items()
                ],
            )
            report.target(
                f"engines mode: (window - collective floor) at {large} / at {small} engines (p50)",
                above[large] / above[small],
                1.3,
                "x",
            )
    parts = ("stop_skew_ms", "after_last_stop_ms", "switch_max_ms", "resume_max_ms", "resume_skew_ms")
    if engines:
        report.add_table(
            "Engines mode: where the window goes (p50 ms): first stop -> last stop (stop skew) + last "
            "stop -> last resume; the longest switch and resume of one engine; the resumes' spread",
            ["engines", "window", "floor", "stop skew", "last stop -> last resume", "switch (longest)",
             "resume (longest)", "resume skew"],
            [[n, r["window_ms"]["p50"], floor.get(n, {}).get("p50"), *(r[k]["p50"] for k in parts)]
             for n, r in engines.items()],
        )  # fmt: skip
        if small in engines and large in engines and small != large:
            report.results["engines_parts_growth_ms"] = {
                k: round(engines[large][k]["p50"] - engines[small][k]["p50"], 3) for k in parts
            }
    if small in coordinator and large in coordinator and small != large:
        ratio = coordinator[large]["window_ms"]["p50"] / coordinator[small]["window_ms"]["p50"]
        report.results["coordinator_window_ratio"] = round(ratio, 3)
    for size, row in engines.items():
        report.target(
            f"engines mode: coordinator's time inside the window, {size} engines (max)",
            row["coordinator_inside_ms"]["max"],
            0.0,
            "ms",
        )
    report.targets_table()
    report.notes.append(NOISE_NOTE)
    draw(rows, sizes, args.name)
    report.write()


def draw(rows: list[dict[str, Any]], sizes: Sequence[int], name: str) -> None:
    fig, (ax,) = new_figure()
    for mode, marker in (("coordinator", "s"), ("engines", "o")):
        mine = [r for r in rows if r["commit"] == mode]
        ax.plot(
            [r["engines"] for r in mine],
            [r["window_ms"]["p50"] for r in mine],
            marker=marker,
            label=f"{mode}: window p50",
        )
        ax.plot(
            [r["engines"] for r in mine],
            [r["coordinator_inside_ms"]["p50"] for r in mine],
            marker=marker,
            linestyle="--",
            label=f"{mode}: coordinator inside p50",
        )
    ax.set_xticks(list(sizes), [str(s) for s in sizes])
    ax.set_xlabel("engines")
    ax.set_ylabel("ms (p50)")
    ax.set_title("Commit window vs fleet size, by commit mode")
    ax.legend(fontsize=8)
    save_figure(fig, name)  # beside the JSON and table of the same --name


if __name__ == "__main__":
    main()
