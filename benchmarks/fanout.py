"""Item 5: the prepare/commit round trip across 1, 8, 32 and 64 agents.

Lightweight agents (benchmarks/lightweight_agent.py: protocol-compliant, torch-free, every phase
completes at once) isolate what the coordinator's fan-out itself costs. The driver is the
coordinator's own fan-out code: `app.agents.fleet.Fleet` (one shared httpx client, one `AgentClient`
per engine), called the way `app.jobs.runner.JobRunner` calls it (send the step to every participant
at once, then poll every one's `GET /v1/reconfig` until all report the phase, with the runner's own
poll intervals: `agent_poll_interval_s` in prepare/sync, `commit_poll_interval_s` inside the pause).
The database writes of a job are left out here (benchmarks/api.py covers the API and the database).

All agents are started once (several per process so 64 fit this 2-core machine); every round runs
each agent count once, in a shuffled order, so the ratio between counts is not skewed by load that
other processes put on the machine at one moment.

    .venv/bin/python benchmarks/fanout.py                       # 1, 8, 32, 64 agents, 20 rounds
    .venv/bin/python benchmarks/fanout.py --counts 1 8 --rounds 5

Target: the round trip with 64 agents <= 2x the round trip with 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common import (
    PYTHON,
    ROOT,
    ProcessGroup,
    Report,
    new_figure,
    save_figure,
    scratch_dir,
    summarize,
    wait_for_file,
)

from app.agents.client import AgentCallError, AgentClient
from app.agents.fleet import Fleet
from app.jobs.runner import RunnerSettings
from engine_agent.protocol import (
    Member,
    PrepareRequest,
    ReconfigPhase,
    StoreAddress,
    Strategy,
    TransferBackend,
    WarmupPolicy,
)


@dataclass
class AgentRef:
    engine_id: str
    url: str


def start_agents(group: ProcessGroup, count: int, procs: int, tag: str) -> list[AgentRef]:
    """Start `count` lightweight agents spread over `procs` processes; all serve generation 1."""
    procs = max(1, min(procs, count))
    per_proc = [count // procs + (1 if i < count % procs else 0) for i in range(procs)]
    scratch = scratch_dir("fanout")
    started = []
    first = 0
    for i, n in enumerate(per_proc):
        ready = scratch / f"{tag}-{i}.json"
        ready.unlink(missing_ok=True)
        argv = [
            PYTHON, str(ROOT / "benchmarks" / "lightweight_agent.py"),
            "--count", str(n), "--first-index", str(first), "--serving", str(count),
            "--ready-file", str(ready), "--prefix", f"{tag}-",
        ]  # fmt: skip
        started.append((group.start(f"{tag}-agents-{i}", argv), ready))
        first += n
    agents: list[AgentRef] = []
    for proc, ready in started:
        for entry in json.loads(wait_for_file(ready, proc, timeout_s=60)):
            agents.append(AgentRef(entry["engine_id"], entry["url"]))
    return agents


def prepare_request(agents: Sequence[AgentRef], job_id: str, generation: int) -> PrepareRequest:
    members = [Member(engine_id=a.engine_id, url=a.url) for a in agents]
    return PrepareRequest(
        job_id=job_id,
        generation=generation + 1,
        old_generation=generation,
        members=members,
        old_members=members,
        placement=[[0] for _ in agents],
        store=StoreAddress(host="127.0.0.1", port=1),
        warmup_policy=WarmupPolicy.eager,
        strategy=Strategy.background,
        transfer_backend=TransferBackend.gloo,
    )


async def send_and_await(
    fleet: Fleet,
    clients: Sequence[AgentClient],
    job_id: str,
    send: Any,
    want: ReconfigPhase,
    poll_interval_s: float,
) -> int:
    """The runner's `_send` + `await_phase`: the step to all at once, then poll all until `want`.
    Returns how many HTTP calls it took."""
    await fleet.all(clients, send)
    waiting = {c.engine_id: c for c in clients}
    calls = len(clients)
    while True:
        calls += len(waiting)
        results = await fleet.each(waiting.values(), lambda c: c.reconfig())
        for engine_id, status in results.items():
            if isinstance(status, AgentCallError):
                raise status
            if status is not None and status.job_id == job_id and status.phase == want:
                waiting.pop(engine_id)
        if not waiting:
            return calls
        await asyncio.sleep(poll_interval_s)


async def one_round(
    fleet: Fleet, agents: Sequence[AgentRef], generation: int, settings: RunnerSettings
) -> dict[str, float]:
    job_id = f"fanout-{uuid.uuid4().hex[:8]}"
    request = prepare_request(agents, job_id, generation)
    clients = [fleet.client(a.engine_id, a.url) for a in agents]
    slow, fast = settings.agent_poll_interval_s, settings.commit_poll_interval_s
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    calls = await send_and_await(
        fleet, clients, job_id, lambda c: c.prepare(request), ReconfigPhase.prepared, slow
    )
    t1 = time.perf_counter()
    calls += await send_and_await(
        fleet, clients, job_id, lambda c: c.sync(job_id), ReconfigPhase.synced, slow
    )
    t2 = time.perf_counter()
    lease = settings.pause_lease_s
    calls += await send_and_await(
        fleet, clients, job_id, lambda c: c.pause(job_id, lease_s=lease), ReconfigPhase.paused, fast
    )
    t3 = time.perf_counter()
    calls += await send_and_await(
        fleet, clients, job_id, lambda c: c.switch(job_id), ReconfigPhase.committed, fast
    )
    t4 = time.perf_counter()
    cpu_ms = (time.process_time() - cpu0) * 1000
    return {
        "prepare_ms": (t1 - t0) * 1000,
        "sync_ms": (t2 - t1) * 1000,
        "pause_ms": (t3 - t2) * 1000,
        "switch_ms": (t4 - t3) * 1000,
        "commit_ms": (t4 - t2) * 1000,
        "round_trip_ms": (t4 - t0) * 1000,
        "coordinator_cpu_ms": cpu_ms,
        "http_calls": float(calls),
        "coordinator_cpu_per_call_ms": cpu_ms / calls,
    }


async def measure(
    agents: Sequence[AgentRef], counts: Sequence[int], rounds: int, warmup: int, settings: RunnerSettings
) -> dict[int, dict[str, list[float]]]:
    samples: dict[int, dict[str, list[float]]] = {n: {} for n in counts}
    rng = random.Random(7)
    generation = 1
    async with Fleet(timeout_s=settings.agent_call_timeout_s) as fleet:
        for index in range(warmup + rounds):
            order = list(counts)
            rng.shuffle(order)
            for n in order:
                times = await one_round(fleet, agents[:n], generation, settings)
                generation += 1
                if index >= warmup:
                    for key, value in times.items():
                        samples[n].setdefault(key, []).append(value)
    return samples


def draw(rows: list[dict[str, Any]], ratio: float) -> None:
    fig, (ax,) = new_figure()
    counts = [r["agents"] for r in rows]
    for key, label in (
        ("round_trip_ms", "round trip (prepare+sync+pause+switch)"),
        ("prepare_ms", "prepare"),
        ("commit_ms", "commit (pause+switch)"),
    ):
        ax.plot(counts, [r[key]["p50"] for r in rows], marker="o", label=f"{label} p50")
    base = rows[0]["round_trip_ms"]["p50"]
    ax.axhline(2 * base, color="grey", linestyle="--", label=f"target: 2x the round trip of {counts[0]}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.set_xlabel("agents")
    ax.set_ylabel("ms (p50)")
    ax.set_title(f"Fan-out round trip vs agents ({counts[-1]} / {counts[0]} = {ratio:.2f}x)")
    ax.legend(fontsize=8)
    save_figure(fig, "fanout")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--agent-procs", type=int, default=4, help="processes hosting the agents")
    args = parser.parse_args(argv)
    counts = sorted(set(args.counts))
    settings = RunnerSettings()

    report = Report("fanout")
    report.parameters = vars(args) | {
        "driver": "app.agents.fleet.Fleet + AgentClient, stepped like app.jobs.runner.JobRunner",
        "agent_poll_interval_s": settings.agent_poll_interval_s,
        "commit_poll_interval_s": settings.commit_poll_interval_s,
    }
    with ProcessGroup(scratch_dir("fanout")) as group:
        t0 = time.perf_counter()
        agents = start_agents(group, counts[-1], args.agent_procs, "light")
        report.results["agents_start_s"] = round(time.perf_counter() - t0, 2)
        samples = asyncio.run(measure(agents, counts, args.rounds, args.warmup, settings))

    rows = [{"agents": n, **{key: summarize(values) for key, values in samples[n].items()}} for n in counts]
    base = rows[0]["round_trip_ms"]["p50"]
    report.results["by_agent_count"] = rows
    report.add_table(
        f"Fan-out round trip through the coordinator's Fleet ({args.rounds} rounds per count, ms)",
        ["agents", "prepare p50", "sync p50", "pause p50", "switch p50", "round trip p50",
         "round trip p99", "HTTP calls", "coord. CPU p50", "CPU per call", "x of first"],
        [
            [r["agents"], r["prepare_ms"]["p50"], r["sync_ms"]["p50"], r["pause_ms"]["p50"],
             r["switch_ms"]["p50"], r["round_trip_ms"]["p50"], r["round_trip_ms"]["p99"],
             r["http_calls"]["p50"], r["coordinator_cpu_ms"]["p50"],
             r["coordinator_cpu_per_call_ms"]["p50"], r["round_trip_ms"]["p50"] / base]
            for r in rows
        ],
    )  # fmt: skip
    ratio = rows[-1]["round_trip_ms"]["p50"] / base
    report.results["ratio_last_to_first"] = round(ratio, 3)
    report.target(
        f"round trip {rows[-1]['agents']} agents / {rows[0]['agents']} agent (p50)", ratio, 2.0, "x"
    )
    report.targets_table()
    draw(rows, ratio)
    report.write()


if __name__ == "__main__":
    main()
