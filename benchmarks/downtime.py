"""Items 1-4: downtime against the blocking baseline, commit window vs model size, its breakdown, and
the coordinator's own overhead.

Real processes throughout: a uvicorn coordinator (job runner on, SQLite) whose local launcher starts
and stops `epctl-agent` processes running the reference MoE engine (gloo groups, NIXL weight transfer
when installed). A steady client (threads sending `/v1/infer` one after another to the two engines
that serve the whole time) records every response, so the downtime the client saw (the longest gap in
successful responses around each job's window) is measured beside the downtime the job reports (the
union of the serving engines' pause intervals).

For each model size (expert weight bytes x1, x4, x16 by growing the intermediate size) it scales a
deployment 0 -> 2, then runs the cycles (default 2 -> 4 -> 2 and 2 -> 3 -> 2) for every strategy
(background, blocking) and warm-up policy (eager, deferred), several repetitions each, interleaved so
load drift on this shared machine hits every configuration alike.

    .venv/bin/python benchmarks/downtime.py                         # the full run (about 10-15 min here)
    .venv/bin/python benchmarks/downtime.py --quick                 # x1 only, one repetition
    .venv/bin/python benchmarks/downtime.py --scales 1 --reps 2 --cycles 2,4,2

Targets: background downtime <= 5% of blocking (item 1); background commit window grows <= 1.2x from
x1 to x16 while blocking grows with bytes (item 2); commit window p50 <= 50 ms at x1 (item 3);
coordinator overhead (commit as the coordinator sees it minus the longest engine pause) p50 <= 10 ms
(item 4).
"""

from __future__ import annotations

import argparse
import itertools
import random
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from common import (
    PYTHON,
    Coordinator,
    Report,
    new_figure,
    save_figure,
    scratch_dir,
    summarize,
)

from app.probe.outage import client_outage
from engine_agent import tensor_wire
from tests.support.processes import AGENT_KEY, AGENT_KEY_HEADERS
from tests.support.stack import outage_covering_ms

ADMIN_TOKEN = "bench-downtime-admin-0123456789"
BINARY_HEADERS = {"content-type": tensor_wire.MEDIA_TYPE, "accept": tensor_wire.MEDIA_TYPE}
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]

# Generous deadlines: this is a measurement, not a failure test, on a loaded 2-core machine.
RUNNER_ENV = {
    "EPCTL_RUNNER_ENABLED": "true",
    "EPCTL_RUNNER_POLL_INTERVAL_S": "0.1",
    "EPCTL_RUNNER_LAUNCH_DEADLINE_S": "120",
    "EPCTL_RUNNER_PREPARE_DEADLINE_S": "120",
    "EPCTL_RUNNER_PAUSE_DEADLINE_S": "120",
    "EPCTL_RUNNER_SWITCH_DEADLINE_S": "60",
    "EPCTL_RUNNER_PAUSE_LEASE_S": "120",
    "EPCTL_RUNNER_TRANSFER_S": "90",
    "EPCTL_RUNNER_COLLECTIVE_S": "60",
    "EPCTL_RUNNER_RENDEZVOUS_S": "60",
    "EPCTL_RUNNER_LOCAL_AGENT_ARGS": "--heartbeat-s 2",
}


# ---------------------------------------------------------------------------------------------------
# the steady client


@dataclass
class Sample:
    sent_at: float  # epoch seconds
    done_at: float
    ok: bool
    error: float = 0.0  # max |output - reference| / max |reference|


@dataclass
class SteadyClient:
    """`streams` threads, each sending one request after another to `urls` in turn."""

    urls: list[str]
    tokens: list[list[float]]
    expected: list[list[float]]
    streams: int = 4
    samples: list[Sample] = field(default_factory=list)
    scale: float = 1.0  # max |reference output|: errors are quoted relative to it
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> SteadyClient:
        self.scale = max(abs(v) for row in self.expected for v in row) or 1.0
        for stream in range(self.streams):
            thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self, stream: int) -> None:
        # The binary tensor body (engine_agent.tensor_wire): no JSON floats on either side.
        rows, width = len(self.tokens), len(self.tokens[0])
        body = tensor_wire.encode(
            "float32", (rows, width), struct.pack(f"<{rows * width}f", *itertools.chain(*self.tokens))
        )
        expected = list(itertools.chain(*self.expected))
        with httpx.Client(timeout=120.0, transport=httpx.HTTPTransport(socket_options=NODELAY)) as http:
            for i in itertools.count(stream):
                if self._stop.is_set():
                    return
                url = self.urls[i % len(self.urls)]
                sent = time.time()
                try:
                    response = http.post(f"{url}/v1/infer", content=body, headers=BINARY_HEADERS)
                    done = time.time()
                    if response.status_code == 200:
                        _, data = tensor_wire.decode(response.content)
                        outputs = struct.unpack(f"<{len(data) // 4}f", data)
                        worst = max(abs(a - b) for a, b in zip(outputs, expected, strict=True))
                        self.samples.append(Sample(sent, done, True, worst / self.scale))
                    else:
                        self.samples.append(Sample(sent, done, False))
                        self.errors.append(f"{response.status_code} {response.text[:120]}")
                except httpx.HTTPError as exc:
                    self.samples.append(Sample(sent, time.time(), False))
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def gap_covering_ms(self, start: float, end: float) -> float:
        """The tests' measure of one event (`tests.support.stack.outage_covering_ms`)."""
        return outage_covering_ms(list(self.samples), start, end)

    def in_window(self, start: float, end: float) -> dict[str, int]:
        """Responses that completed inside [start, end]: successes (the engine served while it
        reported itself down?) and failures."""
        done = [s for s in list(self.samples) if start <= s.done_at <= end]
        return {"ok": sum(1 for s in done if s.ok), "failed": sum(1 for s in done if not s.ok)}

    def longest_gap_ms(self, start: float, end: float) -> float:
        """The longest stretch with no successful answer within [start, end] (the same rule, clipped:
        the probe's `client_outage_ms` over the same span, from outside)."""
        found = client_outage(list(self.samples), start=start, end=end)
        return found.ms if found else 0.0

    def request_p50_ms(self, start: float, end: float) -> float | None:
        """p50 latency of the successful requests sent within [start, end]."""
        latencies = [
            (s.done_at - s.sent_at) * 1000.0 for s in list(self.samples) if s.ok and start <= s.sent_at <= end
        ]
        return summarize(latencies).get("p50") if latencies else None

    def latency_ms(self) -> dict[str, float]:
        return summarize([(s.done_at - s.sent_at) * 1000.0 for s in list(self.samples) if s.ok])


# ---------------------------------------------------------------------------------------------------
# the coordinator and its jobs


class Stack:
    """The harness's coordinator (job runner on, local launcher) and its jobs."""

    def __init__(self, data_dir: Path, agent_command: str = "") -> None:
        env = dict(RUNNER_ENV)
        if agent_command:
            env["EPCTL_RUNNER_LOCAL_AGENT_COMMAND"] = agent_command
        self.coordinator = Coordinator(
            f"sqlite:///{data_dir / 'coordinator.db'}", data_dir, env=env, admin_token=ADMIN_TOKEN
        )
        self.coordinator.env["EPCTL_RUNNER_PUBLIC_URL"] = self.coordinator.url
        self.coordinator.start(ready_timeout_s=120)
        self.url = self.coordinator.url
        self.api = self.coordinator.client(timeout_s=60.0)

    def create_deployment(self, name: str, engine: dict[str, Any]) -> None:
        body = {
            "name": name,
            "engine": engine,
            "min_dp_size": 1,
            "max_dp_size": 8,
            "launcher": "local",
            "agent_key": AGENT_KEY,  # so this benchmark may read the engines' own figures (`/v1/info`)
        }
        response = self.api.post("/v1/deployments", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"create deployment: {response.status_code} {response.text}")

    def scale(self, deployment: str, target: int, timeout_s: float = 600.0, **fields: Any) -> dict[str, Any]:
        body = {"deployment": deployment, "target_dp_size": target, "reason": "benchmark", **fields}
        response = self.api.post("/v1/reconfigurations", json=body)
        if response.status_code != 202:
            raise RuntimeError(f"scale: {response.status_code} {response.text}")
        return self.coordinator.wait_job(response.json()["id"], timeout_s=timeout_s)

    def close(self) -> None:
        """Stops the coordinator and every agent its local launcher started."""
        self.api.close()
        self.coordinator.close()


PROBE_KEYS = (
    "canaries_sent",
    "canaries_failed",
    "interval_ms",
    "latency_p50_ms_outside_outage",
    "outage_window",
    "outage_phase",
    "slowest_answer_phase",
    "longest_gap_ms",
    "phases",
    "unreachable",
)


def _epoch(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def engine_step_p50_ms(urls: list[str]) -> float | None:
    """The median over engines of each engine's p50 step duration (its recent real steps)."""
    values = []
    for url in urls:
        try:
            step = (
                httpx.get(f"{url}/v1/info", headers=AGENT_KEY_HEADERS, timeout=10).json().get("step_ms") or {}
            )
        except httpx.HTTPError:
            continue
        if step.get("p50") is not None:
            values.append(float(step["p50"]))
    return summarize(values).get("p50") if values else None


def _seconds(phase: dict[str, Any] | None) -> float | None:
    if not phase or not phase.get("started_at") or not phase.get("ended_at"):
        return None
    started = datetime.fromisoformat(phase["started_at"])
    ended = datetime.fromisoformat(phase["ended_at"])
    return (ended - started).total_seconds() * 1000.0


def job_record(job: dict[str, Any], client: SteadyClient, meta: dict[str, Any]) -> dict[str, Any]:
    """What one job showed: its downtime, the client's gap, the breakdown of the longest pause."""
    downtime = job.get("downtime") or {}
    serving = {r["engine_id"] for r in job["engine_results"] if r.get("old_rank") is not None}
    pauses = [r["pause"] for r in job["engine_results"] if r.get("pause") and r["engine_id"] in serving]
    longest = max(pauses, key=lambda p: p.get("pause_ms") or 0.0, default=None)
    start, end = downtime.get("window_start"), downtime.get("window_end")
    coordinator = downtime.get("coordinator") or {}
    coordinator_commit_ms = sum(coordinator.values()) if coordinator else None
    probe = job.get("probe") or {}
    record = {
        **meta,
        "job_id": job["id"],
        "state": job["state"],
        "error": job.get("error"),
        "downtime_ms": job.get("downtime_ms"),
        "client_outage_ms": job.get("client_outage_ms"),
        "client_slowest_answer_ms": job.get("client_slowest_answer_ms"),
        "probe_longest_gap_ms": probe.get("longest_gap_ms"),
        "probe": {k: probe.get(k) for k in PROBE_KEYS},
        "span": [_epoch(job.get("created_at")), _epoch(job.get("finished_at"))],
        "window": [start, end] if start is not None and end is not None else None,
        "client_gap_ms": None,  # filled in once the client stopped (late responses must arrive first)
        "longest_pause_ms": longest.get("pause_ms") if longest else None,
        "breakdown": {
            k: longest.get(k)
            for k in ("boundary_wait_ms", "warmup_ms", "blocking_prepare_ms", "switch_ms", "resume_ms")
        }
        if longest
        else {},
        "coordinator_commit": coordinator,
        "coordinator_commit_ms": coordinator_commit_ms,
        "phases_ms": {name: _seconds(p) for name, p in (job.get("phases") or {}).items()},
        "transfer_backend": next(
            (r["transfer_backend"] for r in job["engine_results"] if r.get("transfer_backend")), None
        ),
        "bytes_moved": sum(r.get("bytes_moved") or 0 for r in job["engine_results"]),
    }
    if coordinator_commit_ms is not None and record["longest_pause_ms"] is not None:
        record["coordinator_overhead_ms"] = coordinator_commit_ms - record["longest_pause_ms"]
        # The pause request waits for the engine's step boundary before the window opens: engine time
        # the coordinator cannot shorten, so it is also shown taken out.
        wait = record["breakdown"].get("boundary_wait_ms") or 0.0
        record["coordinator_overhead_less_boundary_ms"] = record["coordinator_overhead_ms"] - wait
    return record


# ---------------------------------------------------------------------------------------------------
# one model size


def engine_for(scale: int, base: dict[str, int]) -> dict[str, Any]:
    return {
        "num_logical_experts": base["experts"],
        "num_redundant_experts": 0,
        "hidden_size": base["hidden"],
        "intermediate_size": base["intermediate"] * scale,
        "top_k": 2,
        "dtype": "float32",
        "seed": 0,
    }


def expert_bytes(engine: dict[str, Any]) -> int:
    return 3 * engine["hidden_size"] * engine["intermediate_size"] * 4 * engine["num_logical_experts"]


def run_scale(
    stack: Stack,
    scale: int,
    args: argparse.Namespace,
    cycles: list[list[int]],
    strategies: list[str],
    policies: list[str],
    reps: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch

    from engine_agent import moe
    from engine_agent.protocol import EngineConfig

    engine = engine_for(
        scale, {"experts": args.experts, "hidden": args.hidden, "intermediate": args.intermediate}
    )
    name = f"bench-x{scale}"
    stack.create_deployment(name, engine)
    first = stack.scale(name, 2)
    if first["state"] != "succeeded":
        raise RuntimeError(f"0 -> 2 failed: {first.get('error')}")
    base_urls = [r["url"] for r in sorted(first["engine_results"], key=lambda r: r["new_rank"] or 0)]
    tokens = torch.randn(args.tokens, engine["hidden_size"], generator=torch.Generator().manual_seed(7))
    expected = moe.reference_forward(EngineConfig(**engine), tokens).tolist()
    client = SteadyClient(base_urls, tokens.tolist(), expected, streams=args.streams).start()
    time.sleep(1.0)
    records: list[dict[str, Any]] = []
    configs = [(c, s, p) for c in cycles for s in strategies for p in policies]
    rng = random.Random(scale)
    try:
        for rep in range(reps):
            order = list(configs)
            rng.shuffle(order)
            for cycle, strategy, policy in order:
                for before, after in itertools.pairwise(cycle):
                    job = stack.scale(name, after, strategy=strategy, warmup_policy=policy)
                    meta = {
                        "scale": scale,
                        "cycle": "->".join(map(str, cycle)),
                        "leg": f"{before}->{after}",
                        "strategy": strategy,
                        "policy": policy,
                        "rep": rep,
                    }
                    record = job_record(job, client, meta)
                    members = [r["url"] for r in job["engine_results"] if r.get("new_rank") is not None]
                    record["engines_after"] = len(members)
                    record["engine_step_p50_ms"] = engine_step_p50_ms(members)
                    records.append(record)
                    wait_ms = record["breakdown"].get("boundary_wait_ms") or 0.0
                    print(
                        f"x{scale} {meta['leg']:5} {strategy:10} {policy:8} rep {rep}: {job['state']} "
                        f"downtime {record['downtime_ms'] or 0:8.1f} ms, probe: client outage "
                        f"{record['client_outage_ms'] or 0:8.1f} ms, slowest answer "
                        f"{record['client_slowest_answer_ms'] or 0:8.1f} ms "
                        f"(boundary wait before it {wait_ms:.0f} ms, engine step p50 "
                        f"{record['engine_step_p50_ms']} ms)",
                        flush=True,
                    )
                    if job["state"] == "rolled_back":
                        # Failed safely before commit: nothing changed, the deployment is still at
                        # `before`. Recorded (and counted in the results); skip the rest of this cycle.
                        print(f"  rolled back: {job.get('error')}", flush=True)
                        break
                    if job["state"] != "succeeded":
                        raise RuntimeError(f"job {job['id']} {job['state']}: {job.get('error')}")
                    time.sleep(0.3)  # let the client's samples settle between jobs
    finally:
        time.sleep(1.0)  # requests held during the last window complete
        client.stop()
    for record in records:
        if record["window"] is not None:
            start, end = record["window"]
            record["client_gap_ms"] = client.gap_covering_ms(start, end)
            record["client_in_window"] = client.in_window(start, end)
        span_start, span_end = record["span"]
        if span_start is not None and span_end is not None:
            record["client_longest_gap_ms"] = client.longest_gap_ms(span_start, span_end)
            record["client_request_p50_ms"] = client.request_p50_ms(span_start, span_end)
    wrong = sum(1 for s in client.samples if s.ok and s.error > args.tolerance)
    failed = sum(1 for s in client.samples if not s.ok)
    info = {
        "scale": scale,
        "engine": engine,
        "expert_weight_bytes_total": expert_bytes(engine),
        "client_requests": len(client.samples),
        "client_failed": failed,
        "client_wrong_outputs": wrong,
        "client_max_relative_error": max((s.error for s in client.samples if s.ok), default=0.0),
        "client_errors_sample": client.errors[:5],
        "client_latency_ms": client.latency_ms(),
    }
    stack.scale(name, 1)  # stop the engines of this size before the next one starts
    return records, info


# ---------------------------------------------------------------------------------------------------
# analysis


def pick(records: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def p50(records: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in records if r.get(key) is not None]
    return summarize(values).get("p50", float("nan")) if values else float("nan")


def pmax(records: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in records if r.get(key) is not None]
    return max(values) if values else float("nan")


def analyse(
    report: Report, all_records: list[dict[str, Any]], infos: list[dict[str, Any]], main_scale: int
) -> None:
    failed = [r for r in all_records if r["state"] != "succeeded"]
    report.results["jobs_not_succeeded"] = [
        {k: r.get(k) for k in ("job_id", "scale", "leg", "strategy", "policy", "state", "error")}
        for r in failed
    ]
    for r in failed:
        report.notes.append(
            f"job {r['job_id']} (x{r['scale']} {r['leg']} {r['strategy']} {r['policy']}) ended {r['state']}: "
            f"{(r.get('error') or {}).get('message')}; left out of the timings"
        )
    records = [r for r in all_records if r["state"] == "succeeded"]
    base_scale = main_scale
    base = pick(records, scale=base_scale)
    legs = sorted({r["leg"] for r in base}, key=lambda leg: [int(x) for x in leg.split("->")])
    policies = sorted({r["policy"] for r in base})

    # Item 1: downtime per strategy and policy, and the ratio.
    rows = []
    ratios: list[float] = []
    for leg in legs:
        for policy in policies:
            bg = pick(base, leg=leg, policy=policy, strategy="background")
            bl = pick(base, leg=leg, policy=policy, strategy="blocking")
            ratio = p50(bg, "downtime_ms") / p50(bl, "downtime_ms") if bl and bg else float("nan")
            if ratio == ratio:
                ratios.append(ratio)
            rows.append(
                [leg, policy, p50(bg, "downtime_ms"), pmax(bg, "downtime_ms"), p50(bg, "client_gap_ms"),
                 p50(bl, "downtime_ms"), pmax(bl, "downtime_ms"), p50(bl, "client_gap_ms"),
                 f"{100 * ratio:.1f}%"]
            )  # fmt: skip
    report.add_table(
        f"Item 1: downtime, background vs blocking (x{base_scale} model, ms, p50/max over repetitions)",
        ["leg", "policy", "bg job p50", "bg job max", "bg client p50", "block job p50", "block job max",
         "block client p50", "bg / block"],
        rows,
    )  # fmt: skip
    all_bg = pick(base, strategy="background")
    all_bl = pick(base, strategy="blocking")
    overall = p50(all_bg, "downtime_ms") / p50(all_bl, "downtime_ms") if all_bg and all_bl else float("nan")
    worst = max(ratios) if ratios else float("nan")
    report.results["item1"] = {
        "rows": rows,
        "ratio_overall_p50": overall,
        "ratio_worst_leg_policy": worst,
        "blocking_p50_ms": p50(all_bl, "downtime_ms"),
        "background_p50_ms": p50(all_bg, "downtime_ms"),
    }
    report.target("item 1: background / blocking downtime (p50, all legs)", 100 * overall, 5.0, "%")
    report.target("item 1: background / blocking downtime (worst leg+policy)", 100 * worst, 5.0, "%")
    report.target(
        f"item 1: blocking downtime p50 at x{base_scale} (the model must be big enough)",
        p50(all_bl, "downtime_ms"),
        1000.0,
        "ms",
        at_least=True,
    )

    # Job-reported vs client-seen.
    agree = [
        abs(r["client_gap_ms"] - r["downtime_ms"])
        for r in records
        if r.get("client_gap_ms") is not None and r.get("downtime_ms")
    ]
    report.results["client_vs_job_abs_diff_ms"] = summarize(agree)
    rows_client = []
    for strategy in ("background", "blocking"):
        rs = [r for r in pick(records, strategy=strategy) if r.get("client_gap_ms") is not None]
        inside_ok = sum(r.get("client_in_window", {}).get("ok", 0) for r in rs)
        inside_failed = sum(r.get("client_in_window", {}).get("failed", 0) for r in rs)
        rows_client.append(
            [strategy, len(rs), p50(rs, "downtime_ms"), p50(rs, "client_gap_ms"),
             summarize([r["client_gap_ms"] - r["downtime_ms"] for r in rs if r.get("downtime_ms")])
             .get("p50"),
             inside_ok, inside_failed]
        )  # fmt: skip
    latency = ", ".join(f"x{i['scale']}: {i['client_latency_ms'].get('p50')}" for i in infos)
    report.add_table(
        "Job-reported vs client-seen downtime, all sizes (ms). The client's gap also holds one request's "
        f"latency (p50 per size: {latency} ms)",
        ["strategy", "jobs", "job p50", "client gap p50", "gap - job p50", "successes inside windows",
         "failures inside windows"],
        rows_client,
    )  # fmt: skip

    analyse_clients(report, records, base_scale)

    # Item 2: commit window vs weight bytes.
    scale_rows = []
    for info in sorted(infos, key=lambda i: i["scale"]):
        # The same cycle at every size (the main size also ran others).
        rs = pick(records, scale=info["scale"], cycle="2->4->2") or pick(records, scale=info["scale"])
        bg, bl = pick(rs, strategy="background"), pick(rs, strategy="blocking")
        ratio = p50(bg, "downtime_ms") / p50(bl, "downtime_ms") if bg and bl else float("nan")
        scale_rows.append(
            [f"x{info['scale']}", round(info["expert_weight_bytes_total"] / 2**20, 1),
             p50(bg, "downtime_ms"), pmax(bg, "downtime_ms"), p50(bl, "downtime_ms"), pmax(bl, "downtime_ms"),
             f"{100 * ratio:.1f}%"]
        )  # fmt: skip
    report.add_table(
        "Item 2: commit window (job downtime) vs expert weight bytes, ms (2->4->2 legs)",
        ["size", "expert MiB (all experts)", "background p50", "background max", "blocking p50",
         "blocking max", "bg / block"],
        scale_rows,
    )  # fmt: skip
    report.results["item2"] = {"rows": scale_rows}
    if len(scale_rows) > 1:
        growth_bg = scale_rows[-1][2] / scale_rows[0][2]
        growth_bl = scale_rows[-1][4] / scale_rows[0][4]
        report.results["item2"] |= {"background_growth": growth_bg, "blocking_growth": growth_bl}
        report.target(
            f"item 2: background commit window growth {scale_rows[-1][0]} / x1", growth_bg, 1.2, "x"
        )
        report.target(
            f"item 2: blocking commit window grows with bytes, {scale_rows[-1][0]} / x1",
            growth_bl,
            1.0,
            "x",
            at_least=True,
        )

    # Items 3 and 4: at the smallest (default) size, background strategy.
    base_scale = min(i["scale"] for i in infos)
    bg_base = pick(records, scale=base_scale, strategy="background")
    policies = sorted({r["policy"] for r in bg_base})
    breakdown_keys = ["boundary_wait_ms", "warmup_ms", "switch_ms", "resume_ms"]
    rows3 = []
    for policy in policies:
        rs = pick(bg_base, policy=policy)
        flat = [{**r, **{k: r["breakdown"].get(k) for k in breakdown_keys}} for r in rs]
        rows3.append(
            [policy, len(rs), p50(rs, "downtime_ms"), pmax(rs, "downtime_ms"),
             *[p50(flat, k) for k in breakdown_keys], p50(rs, "longest_pause_ms")]
        )  # fmt: skip
    report.add_table(
        f"Item 3: commit window at x{base_scale}, background strategy "
        "(ms; breakdown of the longest engine pause, p50)",
        ["policy", "jobs", "window p50", "window max", "boundary wait", "warm-up", "switch", "resume",
         "longest pause"],
        rows3,
    )  # fmt: skip
    report.results["item3"] = {"rows": rows3}
    report.target(
        f"item 3: commit window p50 at x{base_scale} (background)", p50(bg_base, "downtime_ms"), 50.0, "ms"
    )

    # Item 4: coordinator overhead.
    rows4 = []
    for policy in policies:
        rs = pick(bg_base, policy=policy)
        # The job's own `committing` phase (state change to state change, database writes included).
        phase = [
            {"v": r["phases_ms"]["committing"] - r["longest_pause_ms"]}
            for r in rs
            if r.get("phases_ms", {}).get("committing") is not None and r.get("longest_pause_ms") is not None
        ]
        rows4.append(
            [policy, p50(rs, "coordinator_commit_ms"), p50(rs, "longest_pause_ms"),
             p50(rs, "coordinator_overhead_ms"), pmax(rs, "coordinator_overhead_ms"),
             p50(rs, "coordinator_overhead_less_boundary_ms"),
             pmax(rs, "coordinator_overhead_less_boundary_ms"), p50(phase, "v")]
        )  # fmt: skip
    report.add_table(
        "Item 4: coordinator overhead, background: pause sent -> all committed, minus the longest pause "
        "(and also minus that engine's wait for its step boundary; last column: the job's `committing` "
        "phase minus the longest pause), ms",
        ["policy", "coordinator commit p50", "longest pause p50", "overhead p50", "overhead max",
         "less boundary wait p50", "less boundary wait max", "committing phase - pause p50"],
        rows4,
    )  # fmt: skip
    report.results["item4"] = {"rows": rows4}
    report.target("item 4: coordinator overhead p50", p50(bg_base, "coordinator_overhead_ms"), 10.0, "ms")
    socket_state = report.parameters.get("agent_socket")
    if socket_state == "proto0":
        report.notes.append(
            "Agent calls answer ~40 ms late in this run: engine_agent/main.py bound its listening socket as "
            "socket.socket(AF_INET, SOCK_STREAM) (proto 0), and asyncio sets TCP_NODELAY only on accepted "
            "sockets whose proto is IPPROTO_TCP, so each response's body waited for the client's delayed "
            "ACK (measured 44-52 ms per call against ~1 ms with proto=IPPROTO_TCP). The commit window holds "
            "the coordinator's poll that sees `paused` and its `switch` call. Fixed in the agent since "
            "(commit 3d2fe59)."
        )
    elif socket_state == "what-if-wrapper":
        report.notes.append(
            "What-if run: agents launched through benchmarks/agent_nodelay.py, which creates the agent's "
            "listening socket with proto IPPROTO_TCP (the fix the agent later adopted in 3d2fe59)."
        )
    else:
        report.notes.append(
            "Agents bind their listening socket with proto IPPROTO_TCP (TCP_NODELAY on responses)."
        )
    report.notes.append(
        "The client-seen gap holds one request's latency besides the stop (the last response before the "
        "window and the first after it); on this loaded 2-core machine an /v1/infer request took hundreds "
        "of ms (see the client table), so the client's view is coarse here."
    )
    report.target(
        "item 4: coordinator overhead less boundary wait p50",
        p50(bg_base, "coordinator_overhead_less_boundary_ms"),
        10.0,
        "ms",
    )


def analyse_clients(report: Report, records: list[dict[str, Any]], scale: int) -> None:
    """Issue 10: per leg, the engines' step, the client's request, the job's downtime, the probe's
    outage, slowest answer and longest gap, the outside client's gaps; and the targets that tie them."""
    base = pick(records, scale=scale)
    for r in base:
        if r.get("client_gap_ms") is not None and r.get("downtime_ms") is not None:
            r["gap_minus_downtime_ms"] = r["client_gap_ms"] - r["downtime_ms"]
        # Like for like: the probe's longest gap between answers against the outside client's.
        if r.get("probe_longest_gap_ms") is not None and r.get("client_longest_gap_ms") is not None:
            r["probe_vs_client_ms"] = abs(r["probe_longest_gap_ms"] - r["client_longest_gap_ms"])
    legs = sorted({r["leg"] for r in base}, key=lambda leg: [int(x) for x in leg.split("->")])
    rows = []
    for leg in legs:
        for strategy in ("background", "blocking"):
            rs = pick(base, leg=leg, strategy=strategy)
            if rs:
                rows.append(
                    [leg, strategy, len(rs), p50(rs, "engine_step_p50_ms"), p50(rs, "client_request_p50_ms"),
                     p50(rs, "downtime_ms"), p50(rs, "client_outage_ms"),
                     p50(rs, "client_slowest_answer_ms"), p50(rs, "probe_longest_gap_ms"),
                     p50(rs, "client_gap_ms"), p50(rs, "client_longest_gap_ms")]
                )  # fmt: skip
    report.add_table(
        f"What clients see, per leg (x{scale}, ms, p50 over jobs and policies): the engines' step, the "
        "outside client's request, the job's downtime, the probe's client outage, slowest answer and "
        "longest gap, and the outside client's gap around the job's window and its longest gap",
        ["leg", "strategy", "jobs", "engine step", "client request", "job downtime_ms",
         "client_outage_ms", "client_slowest_answer_ms", "probe longest gap", "client gap at window",
         "client longest gap"],
        rows,
    )  # fmt: skip
    report.results["clients"] = {"rows": rows}
    step = p50(pick(base, engines_after=4), "engine_step_p50_ms")
    report.target(f"engine step p50 at x{scale} with 4 engines", step, 5.0, "ms")
    report.target("client request p50 (binary)", p50(base, "client_request_p50_ms"), 10.0, "ms")
    step_all = p50(base, "engine_step_p50_ms")
    bound = 2 * step_all + 10.0 if step_all == step_all else float("nan")
    report.target(
        "outside client's gap at the window - job downtime_ms (p50)",
        p50(base, "gap_minus_downtime_ms"),
        bound,
        "ms",
        why="2 engine steps + 10 ms",
    )
    report.target(
        "|probe's longest gap - outside client's longest gap| (p50)",
        p50(base, "probe_vs_client_ms"),
        bound,
        "ms",
        why="2 engine steps + 10 ms",
    )


def draw(records: list[dict[str, Any]], infos: list[dict[str, Any]], name: str, main_scale: int) -> None:
    base_scale = main_scale
    base = pick(records, scale=base_scale)
    fig, (ax1, ax2) = new_figure(ncols=2)
    labels, job_vals, client_vals = [], [], []
    for strategy in ("background", "blocking"):
        for policy in sorted({r["policy"] for r in base}):
            rs = pick(base, strategy=strategy, policy=policy)
            if not rs:
                continue
            labels.append(f"{strategy}\n{policy}")
            job_vals.append(p50(rs, "downtime_ms"))
            client_vals.append(p50(rs, "client_gap_ms"))
    xs = range(len(labels))
    ax1.bar([x - 0.2 for x in xs], job_vals, 0.4, label="job-reported p50")
    ax1.bar([x + 0.2 for x in xs], client_vals, 0.4, label="client-seen p50")
    ax1.set_yscale("log")
    ax1.set_xticks(list(xs), labels)
    ax1.set_ylabel("downtime ms (log)")
    ax1.set_title(f"Downtime per strategy and policy (x{base_scale}, all legs)")
    ax1.legend(fontsize=8)

    sizes = sorted(infos, key=lambda i: i["scale"])
    mib = [i["expert_weight_bytes_total"] / 2**20 for i in sizes]
    for strategy, marker in (("background", "o"), ("blocking", "s")):
        ys = [
            p50(
                pick(records, scale=i["scale"], strategy=strategy, cycle="2->4->2")
                or pick(records, scale=i["scale"], strategy=strategy),
                "downtime_ms",
            )
            for i in sizes
        ]
        ax2.plot(mib, ys, marker=marker, label=f"{strategy} p50")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("expert weights, all experts (MiB)")
    ax2.set_ylabel("commit window ms (log)")
    ax2.set_title("Commit window vs expert weight bytes (2->4->2)")
    ax2.legend(fontsize=8)
    save_figure(fig, name)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16], help="expert bytes multipliers")
    parser.add_argument("--cycles", nargs="+", default=["2,4,2", "2,3,2"])
    parser.add_argument("--strategies", nargs="+", default=["background", "blocking"])
    parser.add_argument("--policies", nargs="+", default=["eager", "deferred"])
    parser.add_argument(
        "--main-scale",
        type=int,
        default=0,
        help="the size that runs every cycle, strategy and policy (item 1); default: the largest scale, "
        "the one where blocking downtime is longest",
    )
    parser.add_argument(
        "--reps", type=int, default=3, help="repetitions of every configuration at the main size"
    )
    parser.add_argument("--other-reps", type=int, default=2, help="repetitions at the other sizes")
    parser.add_argument("--other-cycles", nargs="+", default=["2,4,2"], help="cycles at the other sizes")
    parser.add_argument("--other-policies", nargs="+", default=["eager", "deferred"])
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=2048, help="at x1; x4/x16 multiply it")
    parser.add_argument("--tokens", type=int, default=4, help="tokens per client request")
    parser.add_argument("--streams", type=int, default=4, help="client threads")
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="max |error| / max |reference| for a correct output"
    )
    parser.add_argument("--quick", action="store_true", help="x1 only, one repetition")
    parser.add_argument("--name", default="", help="results file name (default: downtime)")
    parser.add_argument(
        "--from-json", help="redo the tables, targets and PNG from an earlier run's JSON (no new jobs)"
    )
    parser.add_argument(
        "--what-if-agent-nodelay",
        action="store_true",
        help="launch agents through benchmarks/agent_nodelay.py (their listening socket made with "
        "proto IPPROTO_TCP, so responses get TCP_NODELAY): shows what that one-line agent fix buys; "
        "results go to downtime-what-if-nodelay.*",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.scales, args.reps, args.main_scale = [1], 1, 1
    main_scale = args.main_scale or max(args.scales)
    if main_scale not in args.scales:
        parser.error(f"--main-scale {main_scale} is not among --scales {args.scales}")
    cycles = [[int(x) for x in c.split(",")] for c in args.cycles]
    other_cycles = [[int(x) for x in c.split(",")] for c in args.other_cycles]

    agent_command = ""
    name = args.name or "downtime"
    if args.what_if_agent_nodelay:
        agent_command = f"{PYTHON} {Path(__file__).with_name('agent_nodelay.py')}"
        name = args.name or "downtime-what-if-nodelay"
    report = Report(name)
    agent_source = (Path(__file__).resolve().parent.parent / "engine_agent" / "main.py").read_text()
    report.parameters = vars(args) | {
        "runner_env": RUNNER_ENV,
        "agent_socket": "what-if-wrapper"
        if args.what_if_agent_nodelay
        else ("ipproto_tcp" if "IPPROTO_TCP" in agent_source else "proto0"),
    }
    if args.from_json:
        import json

        earlier = json.loads(Path(args.from_json).read_text())
        report.command, report.started_at = earlier["command"], earlier["started_at"]
        report.machine, report.parameters = earlier["machine"], earlier["parameters"]
        report.results = {"sizes": earlier["results"]["sizes"], "jobs": earlier["results"]["jobs"]}
        main_scale = int(
            report.parameters.get("main_scale") or max(i["scale"] for i in report.results["sizes"])
        )
        report.name = Path(args.from_json).stem
        analyse(report, report.results["jobs"], report.results["sizes"], main_scale)
        report.targets_table()
        draw(report.results["jobs"], report.results["sizes"], report.name, main_scale)
        report.write()
        return
    records: list[dict[str, Any]] = []
    infos: list[dict[str, Any]] = []
    scratch = scratch_dir("downtime")
    stack = Stack(scratch, agent_command)
    try:
        for scale in args.scales:
            main_size = scale == main_scale
            recs, info = run_scale(
                stack,
                scale,
                args,
                cycles if main_size else other_cycles,
                args.strategies,
                args.policies if main_size else args.other_policies,
                args.reps if main_size else args.other_reps,
            )
            records += recs
            infos.append(info)
            print(f"x{scale}: client {info['client_requests']} requests, {info['client_failed']} failed, "
                  f"{info['client_wrong_outputs']} wrong", flush=True)  # fmt: skip
    except Exception as exc:  # keep what was measured; say why the run stopped
        report.notes.append(f"run stopped early: {type(exc).__name__}: {exc}")
        print(f"run stopped early: {exc}", flush=True)
    finally:
        stack.close()
    if not records:
        raise SystemExit("no job finished: nothing to report")
    report.results = {"sizes": infos, "jobs": records}
    analyse(report, records, infos, main_scale)
    report.targets_table()
    draw(records, infos, name, main_scale)
    report.write()


if __name__ == "__main__":
    main()
