"""Item 5 / issue 9: the prepare/commit round trip across 1 to 256 agents, and the coordinator's CPU
per agent call.

Lightweight agents (benchmarks/lightweight_agent.py: protocol-compliant, torch-free, every phase
completes at once, served by aiohttp.web) isolate what the coordinator's fan-out itself costs. The
driver is the coordinator's own fan-out code: `app.backends.reference.fanout.Fanout.drive` over its
`Fleet` (one shared aiohttp session with a kept-alive connection per agent, one `AgentClient` per
engine): the step to every participant at once, each POST held by its agent until the phase (the
bounded long-poll protocol), every engine followed on its own, with the runner's own poll intervals
(`agent_poll_interval_s` in prepare/sync, `commit_poll_interval_s` inside the pause) for agents that
cannot hold. The fan-out touches no database (benchmarks/api.py covers the API and the database).

All agents are started once (many per process); every round runs each agent count once, in a
shuffled order, so the ratio between counts is not skewed by load that
other processes put on the machine at one moment.

    .venv/bin/python benchmarks/fanout.py                  # 1, 8, 32, 64, 128, 256 agents, 20 rounds
    .venv/bin/python benchmarks/fanout.py --counts 1 8 --rounds 5

Every call carries the agent key as production sends it (`Authorization: Bearer`, checked by the
agents as `engine_agent.auth` does; `--no-agent-key` for the old keyless fleet). In every round, right
after the coordinator's fan-out, a bare aiohttp fan-out (the anchor: one POST per agent at once with the
same bodies and key over one session, nothing of the coordinator's) drives the same agents through the
same four steps, so each phase has its floor from the same run.

Targets (issue 9): the round trip with 64 agents <= 3x the round trip with 1; the coordinator's CPU
per agent call <= 0.3 ms at every count. Issue 37 item 4: each phase <= 1.5x the anchor's at 64 and 256
agents.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
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
    wait_ready_file,
)

from app import metrics
from app.agents.client import AgentClient
from app.agents.fleet import Fleet
from app.backends.reference.fanout import Fanout, Send
from app.backends.reference.job import JobRun
from app.core.runner_settings import RunnerSettings
from app.jobs.states import JobState
from engine_agent.choreography import Operation
from engine_agent.protocol import (
    EngineConfig,
    JobRef,
    Member,
    PauseRequest,
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


def start_agents(group: ProcessGroup, count: int, procs: int, tag: str, key: str = "") -> list[AgentRef]:
    """Start `count` lightweight agents spread over `procs` processes; all serve generation 1. With
    `key`, every control call needs it (`EPCTL_AGENT_KEY`, as a real agent is started)."""
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
        env = {"EPCTL_AGENT_KEY": key} if key else None
        started.append((group.start(f"{tag}-agents-{i}", argv, env=env), ready))
        first += n
    agents: list[AgentRef] = []
    for proc, ready in started:
        for entry in json.loads(wait_ready_file(ready, proc, timeout_s=60)):
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
    fanout: Fanout,
    run: JobRun,
    clients: Sequence[AgentClient],
    send: Send,
    want: ReconfigPhase,
    poll_interval_s: float,
) -> None:
    """Exactly what the runner does per step (`Fanout.drive`, without progress or cancel checks)."""
    await fanout.drive(
        run, clients, {want}, send=send, job_phase="fanout", deadline_s=60.0, poll_interval_s=poll_interval_s
    )


async def one_round(fanout: Fanout, agents: Sequence[AgentRef], generation: int) -> dict[str, float]:
    settings = fanout.settings
    fleet = fanout.fleet
    job_id = f"fanout-{uuid.uuid4().hex[:8]}"
    run = job_run(job_id)
    request = prepare_request(agents, job_id, generation)
    clients = [fleet.client(a.engine_id, a.url) for a in agents]
    slow, fast = settings.agent_poll_interval_s, settings.commit_poll_interval_s
    lease = settings.pause_lease_s
    calls_before = metrics.agent_calls_total()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    await send_and_await(
        fanout, run, clients, lambda c, w: c.prepare(request, wait_s=w), ReconfigPhase.prepared, slow
    )
    t1 = time.perf_counter()
    await send_and_await(
        fanout, run, clients, lambda c, w: c.sync(job_id, wait_s=w), ReconfigPhase.synced, slow
    )
    t2 = time.perf_counter()
    await send_and_await(
        fanout,
        run,
        clients,
        lambda c, w: c.pause(job_id, lease_s=lease, wait_s=w),
        ReconfigPhase.paused,
        fast,
    )
    t3 = time.perf_counter()
    await send_and_await(
        fanout, run, clients, lambda c, w: c.switch(job_id, wait_s=w), ReconfigPhase.committed, fast
    )
    t4 = time.perf_counter()
    cpu_ms = (time.process_time() - cpu0) * 1000
    calls = metrics.agent_calls_total() - calls_before  # what the coordinator's client sent
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


async def anchor_round(
    session: Any, agents: Sequence[AgentRef], generation: int, key: str, lease_s: float
) -> dict[str, float]:
    """The bare anchor: the same four steps to the same agents with the same bodies and the same key,
    each one POST per agent at once over one aiohttp session (a kept-alive connection per agent), with
    nothing of the coordinator's (no client objects, no validation of the answers, no long-poll
    bookkeeping): what the fan-out costs on this machine at the least."""
    job_id = f"anchor-{uuid.uuid4().hex[:8]}"
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    bodies = [
        (Operation.prepare.path, prepare_request(agents, job_id, generation).model_dump_json().encode()),
        (Operation.sync.path, JobRef(job_id=job_id).model_dump_json().encode()),
        (Operation.pause.path, PauseRequest(job_id=job_id, lease_s=lease_s).model_dump_json().encode()),
        (Operation.switch.path, JobRef(job_id=job_id).model_dump_json().encode()),
    ]

    async def one(url: str, body: bytes) -> None:
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            if response.status >= 300:
                raise RuntimeError(f"anchor {url}: {response.status}")

    out: dict[str, float] = {}
    t_start = time.perf_counter()
    for (path, body), name in zip(bodies, ("prepare", "sync", "pause", "switch"), strict=True):
        t0 = time.perf_counter()
        await asyncio.gather(*(one(a.url + path, body) for a in agents))
        out[f"{name}_ms"] = (time.perf_counter() - t0) * 1000
    out["round_trip_ms"] = (time.perf_counter() - t_start) * 1000
    return out


async def measure(
    agents: Sequence[AgentRef], counts: Sequence[int], rounds: int, warmup: int, key: str = ""
) -> tuple[dict[int, dict[str, list[float]]], RunnerSettings]:
    """Each round: every count once in a shuffled order, the coordinator's fan-out then the bare anchor
    (`anchor_*` samples) to the same agents, back to back."""
    import aiohttp

    samples: dict[int, dict[str, list[float]]] = {n: {} for n in counts}
    rng = random.Random(7)
    generation = 1
    settings = RunnerSettings()  # the defaults the runner uses (EPCTL_RUNNER_* apply here too)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with Fleet(keys=[key] if key else ()) as fleet, aiohttp.ClientSession(connector=connector) as bare:
        fanout = Fanout(fleet, settings)
        for index in range(warmup + rounds):
            order = list(counts)
            rng.shuffle(order)
            for n in order:
                times = await one_round(fanout, agents[:n], generation)
                generation += 1
                anchor = await anchor_round(bare, agents[:n], generation, key, settings.pause_lease_s)
                generation += 1
                if index >= warmup:
                    for name, value in times.items():
                        samples[n].setdefault(name, []).append(value)
                    for name, value in anchor.items():
                        samples[n].setdefault(f"anchor_{name}", []).append(value)
    return samples, settings


def draw(rows: list[dict[str, Any]], ratio: float, name: str = "fanout") -> None:
    fig, (ax,) = new_figure()
    counts = [r["agents"] for r in rows]
    for key, label in (
        ("round_trip_ms", "round trip (prepare+sync+pause+switch)"),
        ("prepare_ms", "prepare"),
        ("commit_ms", "commit (pause+switch)"),
    ):
        ax.plot(counts, [r[key]["p50"] for r in rows], marker="o", label=f"{label} p50")
    base = rows[0]["round_trip_ms"]["p50"]
    ax.axhline(3 * base, color="grey", linestyle="--", label=f"target: 3x the round trip of {counts[0]}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.set_xlabel("agents")
    ax.set_ylabel("ms (p50)")
    ax.set_title(f"Fan-out round trip vs agents ({counts[-1]} / {counts[0]} = {ratio:.2f}x)")
    ax.legend(fontsize=8)
    save_figure(fig, name)  # beside the JSON and table of the same --name


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--agent-procs", type=int, default=8, help="processes hosting the agents")
    parser.add_argument(
        "--no-agent-key", action="store_true", help="agents without a key (as before issue 37's item 4)"
    )
    parser.add_argument("--name", default="fanout")
    args = parser.parse_args(argv)
    counts = sorted(set(args.counts))
    settings = RunnerSettings()  # the defaults the runner uses (EPCTL_RUNNER_* apply here too)

    key = "" if args.no_agent_key else secrets.token_urlsafe(32)
    report = Report(args.name)
    report.parameters = vars(args) | {
        "driver": "app.backends.reference.fanout.Fanout.drive (long-poll) over its Fleet / AgentClient "
        "(aiohttp)",
        "agents": "benchmarks/lightweight_agent.py (aiohttp.web)",
        "cpu_count": os.cpu_count(),
        "agent_key": "none" if not key else "on every call (Authorization: Bearer, checked by the agents)",
        "agent_poll_interval_s": settings.agent_poll_interval_s,
        "commit_poll_interval_s": settings.commit_poll_interval_s,
    }
    with ProcessGroup(scratch_dir("fanout")) as group:
        t0 = time.perf_counter()
        agents = start_agents(group, counts[-1], args.agent_procs, "light", key)
        report.results["agents_start_s"] = round(time.perf_counter() - t0, 2)
        samples, _ = asyncio.run(measure(agents, counts, args.rounds, args.warmup, key))

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
    by_count = {r["agents"]: r for r in rows}
    if 64 in by_count and 1 in by_count:
        ratio_64 = by_count[64]["round_trip_ms"]["p50"] / by_count[1]["round_trip_ms"]["p50"]
        report.results["ratio_64_to_1"] = round(ratio_64, 3)
        report.target("round trip 64 agents / 1 agent (p50)", ratio_64, 3.0, "x")
    for r in rows:
        report.target(
            f"coordinator CPU per agent call, {r['agents']} agents (p50)",
            r["coordinator_cpu_per_call_ms"]["p50"],
            0.3,
            "ms",
        )
    phases = ("prepare", "sync", "pause", "switch", "round_trip")
    report.add_table(
        "The fan-out against the bare aiohttp anchor, same agents, same round (p50 ms, and the ratio)",
        ["agents", *(f"{p} fan-out / anchor" for p in phases)],
        [
            [r["agents"], *(f"{r[f'{p}_ms']['p50']:.1f} / {r[f'anchor_{p}_ms']['p50']:.1f} = "
                            f"{r[f'{p}_ms']['p50'] / r[f'anchor_{p}_ms']['p50']:.2f}x" for p in phases)]
            for r in rows
        ],
    )  # fmt: skip
    for n in (64, 256):
        if n in by_count:
            r = by_count[n]
            for p in phases[:-1]:
                report.target(
                    f"{p}: fan-out / bare anchor, {n} agents (p50)",
                    r[f"{p}_ms"]["p50"] / r[f"anchor_{p}_ms"]["p50"],
                    1.5,
                    "x",
                )
    report.targets_table()
    draw(rows, ratio, args.name)
    report.write()


if __name__ == "__main__":
    main()
