"""Item 5: the prepare/commit round trip across 1, 8, 32 and 64 agents.

Lightweight agents (benchmarks/lightweight_agent.py: protocol-compliant, torch-free, every phase
completes at once) isolate what the coordinator's fan-out itself costs. The driver is the
coordinator's own fan-out code: `app.jobs.runner.JobRunner._send` and `await_phase` over its
`Fleet` (one shared httpx client, one `AgentClient` per engine): send the step to every participant
at once, then poll every one's `GET /v1/reconfig` until all report the phase, with the runner's own
poll intervals (`agent_poll_interval_s` in prepare/sync, `commit_poll_interval_s` inside the pause).
The job's database writes are left out (benchmarks/api.py covers the API and the database).

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

import sqlalchemy
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

from app.agents.client import AgentClient
from app.agents.fleet import Fleet
from app.jobs.runner import JobRun, JobRunner, RunnerSettings
from app.jobs.states import JobState
from engine_agent.protocol import (
    EngineConfig,
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


def make_runner() -> tuple[JobRunner, sqlalchemy.Engine]:
    """The coordinator's job runner, for its fan-out methods only (`_send`, `await_phase`): they touch
    no database when asked for no progress and no cancellation checks (the engine is never used)."""
    engine = sqlalchemy.create_engine("sqlite://")
    return JobRunner(engine, launchers={}), engine


def job_run(job_id: str) -> JobRun:
    return JobRun(
        job_id=job_id,
        deployment_id="fanout",
        deployment_name="fanout",
        launcher_name="static",
        engine_config=EngineConfig(),
        state=JobState.preparing,
        strategy=Strategy.background,
        warmup_requested="eager",
    )


async def send_and_await(
    runner: JobRunner,
    fleet: Fleet,
    run: JobRun,
    clients: Sequence[AgentClient],
    send: Any,
    want: ReconfigPhase,
    poll_interval_s: float,
) -> None:
    """Exactly what the runner does per step. With `JobRunner.drive` (the bounded long-poll
    protocol): the step to every participant at once, each POST held by its agent until the phase,
    every engine followed on its own. Before it: `_send`, then `await_phase` polling every engine."""
    if hasattr(runner, "drive"):
        await runner.drive(
            run, fleet, clients, {want}, send=send, job_phase="fanout", deadline_s=60.0,
            poll_interval_s=poll_interval_s,
        )  # fmt: skip
        return
    await runner._send(fleet, clients, lambda c: send(c, 0.0), "fanout")
    await runner.await_phase(
        run, fleet, clients, {want}, job_phase="fanout", deadline_s=60.0, poll_interval_s=poll_interval_s
    )


class CallCounter:
    """Counts the HTTP requests the driver's client sends (httpx event hook)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, request: Any) -> None:
        self.calls += 1


async def one_round(
    runner: JobRunner, fleet: Fleet, counter: CallCounter, agents: Sequence[AgentRef], generation: int
) -> dict[str, float]:
    settings = runner.settings
    job_id = f"fanout-{uuid.uuid4().hex[:8]}"
    run = job_run(job_id)
    request = prepare_request(agents, job_id, generation)
    clients = [fleet.client(a.engine_id, a.url) for a in agents]
    slow, fast = settings.agent_poll_interval_s, settings.commit_poll_interval_s
    lease = settings.pause_lease_s
    counter.calls = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    await send_and_await(
        runner, fleet, run, clients, lambda c, w: c.prepare(request, wait_s=w), ReconfigPhase.prepared, slow
    )
    t1 = time.perf_counter()
    await send_and_await(
        runner, fleet, run, clients, lambda c, w: c.sync(job_id, wait_s=w), ReconfigPhase.synced, slow
    )
    t2 = time.perf_counter()
    await send_and_await(
        runner,
        fleet,
        run,
        clients,
        lambda c, w: c.pause(job_id, lease_s=lease, wait_s=w),
        ReconfigPhase.paused,
        fast,
    )
    t3 = time.perf_counter()
    await send_and_await(
        runner, fleet, run, clients, lambda c, w: c.switch(job_id, wait_s=w), ReconfigPhase.committed, fast
    )
    t4 = time.perf_counter()
    cpu_ms = (time.process_time() - cpu0) * 1000
    calls = counter.calls
    return {
        "prepare_ms": (t1 - t0) * 1000,
        "sync_ms": (t2 - t1) * 1000,
        "pause_ms": (t3 - t2) * 1000,
        "switch_ms": (t4 - t3) * 1000,
        "commit_ms": (t4 - t2) * 1000,
        "round_trip_ms": (t4 - t0) * 1000,
        "coordinator_cpu_ms": cpu_ms,
        "http_calls": float(calls),
        "coordinator_cpu_per_call_ms": cpu_ms / max(calls, 1),
    }


async def measure(
    agents: Sequence[AgentRef], counts: Sequence[int], rounds: int, warmup: int
) -> tuple[dict[int, dict[str, list[float]]], RunnerSettings]:
    samples: dict[int, dict[str, list[float]]] = {n: {} for n in counts}
    rng = random.Random(7)
    generation = 1
    runner, engine = make_runner()
    counter = CallCounter()
    try:
        async with runner.fleet() as fleet:
            fleet._http.event_hooks["request"].append(counter)  # count what the runner's client sends
            for index in range(warmup + rounds):
                order = list(counts)
                rng.shuffle(order)
                for n in order:
                    times = await one_round(runner, fleet, counter, agents[:n], generation)
                    generation += 1
                    if index >= warmup:
                        for key, value in times.items():
                            samples[n].setdefault(key, []).append(value)
    finally:
        engine.dispose()
    return samples, runner.settings


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
    settings = RunnerSettings()  # the defaults the runner uses (EPCTL_RUNNER_* apply here too)

    report = Report("fanout")
    report.parameters = vars(args) | {
        "driver": "app.jobs.runner.JobRunner.drive (long-poll) over its Fleet / AgentClient"
        if hasattr(JobRunner, "drive")
        else "app.jobs.runner.JobRunner._send + await_phase over its Fleet / AgentClient",
        "agent_poll_interval_s": settings.agent_poll_interval_s,
        "commit_poll_interval_s": settings.commit_poll_interval_s,
    }
    with ProcessGroup(scratch_dir("fanout")) as group:
        t0 = time.perf_counter()
        agents = start_agents(group, counts[-1], args.agent_procs, "light")
        report.results["agents_start_s"] = round(time.perf_counter() - t0, 2)
        samples, _ = asyncio.run(measure(agents, counts, args.rounds, args.warmup))

    rows = [{"agents": n, **{key: summarize(values) for key, values in samples[n].items()}} for n in counts]
    base = rows[0]["round_trip_ms"]["p50"]
    report.results["by_agent_count"] = rows
    report.add_table(
        f"Fan-out round trip through the coordinator's runner ({args.rounds} rounds per count, ms)",
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
