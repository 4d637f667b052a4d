"""Issue 37: one coordinator for a whole fleet (128 / 512 / 2,048 engines), on SQLite and on Postgres.

For each database and size: one real coordinator (uvicorn `app.main:app`, the job runner on) and
lightweight agents (`benchmarks/lightweight_agent.py --fleet`, hundreds per process: they register,
heartbeat at the real interval and answer the reconfiguration protocol at once) in D deployments of 16
engines (14 serving, 2 spare). Then two phases:

- idle (`--idle-s`, first): every agent's heartbeats paused, short of the heartbeat timeout: the
  coordinator's CPU with no request at all (its periodic passes over the fleet alone).
- steady (`--steady-s`): heartbeats only. The coordinator's CPU (from /proc/<pid>/stat) over the phase
  divided by the heartbeats the agents had answered: CPU per heartbeat, and the share of one core the
  fleet's heartbeats take; each heartbeat's round trip is its heartbeat-to-record lag (the coordinator
  answers once the heartbeat is committed). Past saturation the coordinator sheds heartbeats (503 with
  Retry-After, `app.core.shedding`): counted apart (shed a second, shed share, the shed answer's time),
  with the engines heard neither way within the heartbeat timeout (`unheard`: must be 0).
- load: K deployments reconfigure at once (scale up 14 -> 15 and down 14 -> 13 alternately, engine-agreed
  commit), an SSE client follows each job's events (every sequence number, none missed), a webhook
  receives every event, autoscaler hooks post to other deployments, the dashboard's and the CLI's list
  calls run throughout, and agents of two more deployments are killed (self-heal: detection, then a
  shrink job). Per route class p50/p99, job durations, the time from a kill to the engine shown
  `unreachable`, the coordinator's CPU per job.

Then the database's size and write rate, and the slopes between the smallest and the largest size.

    .venv/bin/python benchmarks/fleet.py                               # sqlite+postgres, 128 512 2048
    .venv/bin/python benchmarks/fleet.py --sizes 128 --databases sqlite --steady-s 20
    .venv/bin/python benchmarks/fleet.py --sizes 2048 --databases sqlite --no-load-phase  # steady only
    .venv/bin/python benchmarks/fleet.py --report-from A-partial.json B-partial.json   # one report of runs
    EPCTL_FLEET_PROFILE=1 .venv/bin/python benchmarks/fleet.py --sizes 2048 --databases sqlite
      (the coordinator samples its own stacks: benchmarks/results/tmp/fleet-profile-*.txt)

Targets (issue 37) at 2,048 engines in 128 deployments on this 2-core machine: heartbeats <= 25% of one
core, API p99 <= 100 ms for reads and <= 250 ms for a job creation, heartbeat-to-record lag p99 <= 1 s,
a lost engine detected within the bound it has with 4 engines (the heartbeat timeout + one liveness
pass), every job terminal, the coordinator 0 ms inside every commit window.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from common import (
    PYTHON,
    ROOT,
    Coordinator,
    ProcessGroup,
    Report,
    scratch_dir,
    summarize,
    wait_ready_file,
)

from engine_agent.protocol import EngineConfig, key_check
from tests.support.processes import ADMIN_TOKEN

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
ENGINES_PER_DEPLOYMENT = 16
SERVING = 14  # two spares per deployment: a scale-up has an engine to take
HEARTBEAT_S = 3.0  # the real agent's default (`engine_agent.settings.heartbeat_s`)
HEARTBEAT_TIMEOUT_S = 15.0  # the coordinator's default (`app.core.config.heartbeat_timeout_s`)
IDLE_SETTLE_S = 1.0  # the idle phase: from pausing the heartbeats to measuring
CLK_TCK = os.sysconf("SC_CLK_TCK")
TERMINAL = {"succeeded", "failed", "rolled_back", "cancelled"}

# The API calls an operator's tools make while the fleet runs, by route class.
READS = {
    "dashboard: deployments": "/v1/deployments",
    "dashboard: jobs page": "/v1/reconfigurations?limit=50",
    "cli: engines of a deployment": "/v1/engines?deployment={d}",
    "cli: deployment": "/v1/deployments/{d}",
    "cli: jobs of a deployment": "/v1/reconfigurations?deployment={d}&limit=20",
    "dashboard: incidents": "/v1/incidents",
    "cli: engines (all)": "/v1/engines",
}


def cpu_s(pid: int) -> float:
    """utime + stime of `pid` and its reaped children, seconds (/proc/<pid>/stat fields 14-17)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def database(kind: str, tag: str) -> Iterator[str]:
    if kind == "sqlite":
        path = scratch_dir("fleet") / f"{tag}.db"
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        try:
            yield f"sqlite:///{path}"
        finally:
            for suffix in ("", "-wal", "-shm"):
                path.with_name(path.name + suffix).unlink(missing_ok=True)
        return
    import psycopg

    name = f"epctl_bench_fleet_{os.getpid()}_{tag}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def db_figures(url: str) -> dict[str, float]:
    """Size (MiB) and, on Postgres, rows written so far (inserted + updated + deleted)."""
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        return {"size_mib": size / 2**20}
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        size, written = conn.execute(
            "SELECT pg_database_size(datname), tup_inserted + tup_updated + tup_deleted "
            "FROM pg_stat_database WHERE datname = %s",
            (name,),
        ).fetchone()  # type: ignore[misc]
    return {"size_mib": size / 2**20, "rows_written": float(written)}


class ProfiledCoordinator(Coordinator):
    """The coordinator under `benchmarks/coordinator_profile.py` (a stack sampler around uvicorn)."""

    profile_out: Path | None = None

    def argv(self) -> list[str]:
        if self.profile_out is None:
            return super().argv()
        return [
            PYTHON,
            str(ROOT / "benchmarks" / "coordinator_profile.py"),
            str(self.profile_out),
            "--port",
            str(self.port),
        ]


# ---------------------------------------------------------------------------------------------------
# the fleet


@dataclass
class Fleet:
    deployments: list[str]
    agents: list[dict[str, Any]]  # engine_id, url, deployment, control
    controls: list[str]


def fleet_spec(deployments: Sequence[str]) -> list[dict[str, Any]]:
    """Every engine registers idle; a first job per deployment forms its generation (`form`)."""
    return [
        {"engine_id": f"{d}-e{i}", "deployment": d, "rank": None, "world": 0, "generation": 0}
        for d in deployments
        for i in range(ENGINES_PER_DEPLOYMENT)
    ]


def form(api: httpx.Client, fleet: Fleet, timeout_s: float) -> dict[str, Any]:
    """Every deployment's first generation (0 -> SERVING engines), all jobs at once, as an operator's
    `epctl scale` of each would: how long until every one has ended, and how."""
    started = time.perf_counter()
    ids = []
    create_failures = 0
    for d in fleet.deployments:
        body = {"deployment": d, "target_dp_size": SERVING, "commit": "engines", "reason": "form"}
        try:
            response = api.post("/v1/reconfigurations", json=body)
        except httpx.TimeoutException:
            create_failures += 1  # the coordinator did not answer within the client's 10 s
            continue
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    states: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(states) < len(ids):
        for state in TERMINAL:
            try:
                answer = api.get("/v1/reconfigurations", params={"limit": 200, "state": state})
            except httpx.TimeoutException:
                continue  # a saturated coordinator: asked again at the next round
            states.update({j["id"]: j["state"] for j in answer.json()["data"] if j["id"] in ids})
        time.sleep(1.0)
    return {
        "jobs": len(ids),
        "create_timeouts": create_failures,
        "states": _count(states.values()),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def start_fleet(group: ProcessGroup, api: httpx.Client, coordinator: str, engines: int, tag: str) -> Fleet:
    count = engines // ENGINES_PER_DEPLOYMENT
    names = [f"{tag}-d{k:03d}" for k in range(count)]
    engine = EngineConfig().model_dump()
    checks: dict[str, str] = {}
    for name in names:
        body = {
            "name": name,
            "launcher": "static",
            "min_dp_size": 1,
            "max_dp_size": ENGINES_PER_DEPLOYMENT,
            "engine": engine,
            "autoscale_cooldown_s": 0,
        }
        response = api.post("/v1/deployments", json=body)
        assert response.status_code == 201, response.text
        # Heartbeats carry the agent key's fingerprint, as production agents' do (the coordinator
        # compares it with the key it sends).
        shown = api.post(f"/v1/deployments/{name}/agent-key")
        shown.raise_for_status()
        checks[name] = key_check(shown.json()["key"])
    spec = [s | {"key_check": checks[s["deployment"]]} for s in fleet_spec(names)]
    procs = max(1, min(8, math.ceil(engines / 256)))
    scratch = scratch_dir("fleet")
    started = []
    per = math.ceil(len(names) / procs)
    for i in range(procs):
        own = [s for s in spec if s["deployment"] in set(names[i * per : (i + 1) * per])]
        if not own:
            continue
        spec_file, ready = scratch / f"{tag}-spec-{i}.json", scratch / f"{tag}-ready-{i}.json"
        spec_file.write_text(json.dumps(own))
        ready.unlink(missing_ok=True)
        argv = [
            PYTHON,
            str(ROOT / "benchmarks" / "lightweight_agent.py"),
            "--fleet",
            str(spec_file),
            "--ready-file",
            str(ready),
            "--register",
            coordinator,
            "--token",
            ADMIN_TOKEN,
            "--heartbeat-s",
            str(HEARTBEAT_S),
        ]
        started.append((group.start(f"{tag}-agents-{i}", argv), ready))
    agents: list[dict[str, Any]] = []
    ranks = {s["engine_id"]: s["rank"] for s in spec}
    for proc, ready in started:
        for entry in json.loads(wait_ready_file(ready, proc, timeout_s=300)):
            agents.append(entry | {"rank": ranks[entry["engine_id"]]})
    return Fleet(names, agents, sorted({a["control"] for a in agents}))


def pause(fleet: Fleet, paused: bool) -> None:
    for control in fleet.controls:
        httpx.post(f"{control}/pause", json={"paused": paused}, timeout=30).raise_for_status()


def idle_profiler(pid: int, idle_s: float) -> subprocess.Popen[bytes] | None:
    """With `EPCTL_FLEET_IDLE_PYSPY=FILE`: py-spy samples the idle coordinator's stacks (collapsed) into
    FILE over the idle phase (py-spy beside the venv's python; its own CPU is not the coordinator's)."""
    out = os.environ.get("EPCTL_FLEET_IDLE_PYSPY")
    if not out:
        return None
    spy = Path(PYTHON).with_name("py-spy")
    argv = [str(spy), "record", "-p", str(pid), "-d", str(int(idle_s)), "-r", "200", "-f", "raw", "-o", out]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def phase_profiler(setting: str, pid: int, seconds: float) -> subprocess.Popen[bytes] | None:
    """With `EPCTL_FLEET_STEADY_PYSPY=FILE` (the steady phase: heartbeats only) or
    `EPCTL_FLEET_FORM_PYSPY=FILE` (the formation's first `seconds`): py-spy samples the coordinator's
    stacks (collapsed) into FILE, as `idle_profiler` does over the idle phase."""
    out = os.environ.get(setting)
    if not out:
        return None
    spy = Path(PYTHON).with_name("py-spy")
    argv = [str(spy), "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "100", "-f", "raw", "-o", out]
    argv.append("--nonblocking")  # the coordinator not paused per sample: its CPU figures stay its own
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def active_jobs(api: httpx.Client) -> int:
    """Jobs not yet ended (a formation still running makes an idle phase no idle one)."""
    listed = api.get("/v1/reconfigurations", params={"limit": 200}).json()["data"]
    return sum(1 for j in listed if j["state"] not in TERMINAL)


def idle_phase(api: httpx.Client, fleet: Fleet, pid: int, idle_s: float) -> dict[str, Any]:
    """The coordinator's CPU with the fleet registered and formed but no request at all (every agent's
    heartbeats paused): what its periodic passes cost on their own. Kept short of the heartbeat
    timeout (silence before it + `IDLE_SETTLE_S` + `idle_s` + the 1 s resume stagger < 15 s); every
    agent then beats again and the steady phase starts two intervals later."""
    if idle_s <= 0:
        return {"cpu_share": None, "loadavg": None, "active_jobs": None}
    if HEARTBEAT_S + IDLE_SETTLE_S + idle_s + 1.0 >= HEARTBEAT_TIMEOUT_S - 1.0:
        raise SystemExit(f"--idle-s {idle_s:g}: the engines would be silent past the heartbeat timeout")
    running = active_jobs(api)
    pause(fleet, True)
    try:
        time.sleep(IDLE_SETTLE_S)  # heartbeats in flight answered
        spy = idle_profiler(pid, idle_s)
        cpu0, w0 = cpu_s(pid), time.perf_counter()
        time.sleep(idle_s)
        if spy is not None:
            spy.wait(timeout=60)
        cpu1, w1 = cpu_s(pid), time.perf_counter()
        load = [round(x, 2) for x in os.getloadavg()]
    finally:
        pause(fleet, False)
    share = (cpu1 - cpu0) / (w1 - w0)
    print(
        f"idle phase: {idle_s:g} s, coordinator {100 * share:.1f}% of a core, load {load}, "
        f"{running} jobs not ended",
        flush=True,
    )
    time.sleep(HEARTBEAT_S * 2)  # every agent beating again
    return {"cpu_share": round(share, 4), "loadavg": load, "active_jobs": running}


def beats(fleet: Fleet, reset: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sent": 0, "ok": 0, "failed": 0, "reregistered": 0, "shed": 0,
        "rtt_ms": [], "shed_ms": [], "last_ok": {}, "last_heard": {},
    }  # fmt: skip
    for control in fleet.controls:
        s = httpx.get(f"{control}/stats", params={"reset": "1" if reset else "0"}, timeout=30).json()
        for key in ("sent", "ok", "failed", "reregistered", "shed"):
            out[key] += s[key]
        out["rtt_ms"] += s["rtt_ms"]
        out["shed_ms"] += s["shed_ms"]
        out["last_ok"].update(s["last_ok"])
        out["last_heard"].update(s["last_heard"])
    return out


# ---------------------------------------------------------------------------------------------------
# the load phase's clients


@dataclass
class Load:
    api_ms: dict[str, list[float]] = field(default_factory=dict)
    api_errors: dict[str, int] = field(default_factory=dict)
    sse: dict[str, dict[str, Any]] = field(default_factory=dict)
    webhook_events: list[dict[str, Any]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def timed(self, route: str, ms: float, ok: bool) -> None:
        self.api_ms.setdefault(route, []).append(ms)
        if not ok:
            self.api_errors[route] = self.api_errors.get(route, 0) + 1


async def reader(client: httpx.AsyncClient, load: Load, deployments: Sequence[str], rate_hz: float) -> None:
    """The dashboard's and the CLI's calls, one after another at `rate_hz` in all."""
    rng = random.Random(3)
    routes = list(READS.items())
    while not load.stop.is_set():
        name, path = routes[rng.randrange(len(routes))]
        started = time.perf_counter()
        response = await client.get(path.format(d=rng.choice(deployments)))
        load.timed(name, (time.perf_counter() - started) * 1000.0, response.status_code == 200)
        await asyncio.sleep(1.0 / rate_hz)


async def follow_sse(client: httpx.AsyncClient, load: Load, job_id: str) -> None:
    """One SSE client per job, from its first event to the stream's end: every sequence number."""
    seen: list[int] = []
    started = time.perf_counter()
    async with client.stream("GET", f"/v1/reconfigurations/{job_id}/events", timeout=None) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                with contextlib.suppress(ValueError, TypeError):
                    payload = json.loads(line[5:])
                    if isinstance(payload, dict) and "seq" in payload:
                        seen.append(int(payload["seq"]))
    load.sse[job_id] = {"seqs": seen, "s": time.perf_counter() - started}


async def autoscaler(client: httpx.AsyncClient, load: Load, deployments: Sequence[str]) -> None:
    """Autoscaler notifications (`/v1/hooks/scale`): alternately a target and its withdrawal."""
    rng = random.Random(5)
    while not load.stop.is_set():
        d = rng.choice(deployments)
        for body in (
            {"deployment": d, "target_dp_size": SERVING, "group": "bench"},
            {"deployment": d, "status": "resolved", "group": "bench"},
        ):
            started = time.perf_counter()
            response = await client.post("/v1/hooks/scale", json=body)
            load.timed(
                "autoscaler: scale hook", (time.perf_counter() - started) * 1000.0, response.status_code < 300
            )
        await asyncio.sleep(0.5)


@contextlib.contextmanager
def webhook_receiver(load: Load) -> Iterator[str]:
    """An aiohttp server in a thread of its own that records every delivery (its event and when)."""
    from aiohttp import web

    async def receive(request: web.Request) -> web.Response:
        body = await request.json()
        load.webhook_events.append(
            {"at": time.time(), "type": body.get("type"), "id": request.headers.get("webhook-id")}
        )
        return web.Response(status=204)

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []

    async def serve() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/hook", receive)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port.append(runner.addresses[0][1])
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port[0]}/hook"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


async def watch_lost(client: httpx.AsyncClient, engine_id: str, killed_at: float) -> float:
    """Seconds from the kill to the engine shown `unreachable` (or fenced / written off)."""
    while True:
        response = await client.get(f"/v1/engines/{engine_id}")
        if response.status_code == 200 and response.json()["state"] not in ("serving", "idle", "paused"):
            return time.time() - killed_at
        await asyncio.sleep(0.25)


async def load_phase(
    base: str, fleet: Fleet, jobs_at_once: int, kill_in: int, read_rate_hz: float
) -> dict[str, Any]:
    load = Load()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60, limits=limits) as client:
        chosen = fleet.deployments[:jobs_at_once]
        healed = fleet.deployments[jobs_at_once : jobs_at_once + kill_in]
        scaled = fleet.deployments[jobs_at_once + kill_in :]
        background = [
            asyncio.create_task(reader(client, load, fleet.deployments, read_rate_hz)),
            asyncio.create_task(autoscaler(client, load, scaled)),
        ]
        # Self-heal: one serving engine of each of `healed` stops (serving and heartbeating).
        victims = []
        for d in healed:
            listed = (await client.get("/v1/engines", params={"deployment": d})).json()["data"]
            victims += [e["id"] for e in listed if e["state"] == "serving"][-1:]
        by_control: dict[str, list[str]] = {}
        for a in fleet.agents:
            if a["engine_id"] in victims:
                by_control.setdefault(a["control"], []).append(a["engine_id"])
        killed_at = time.time()
        for control, ids in by_control.items():
            await client.post(f"{control}/kill", json={"engine_ids": ids})
        detect = [asyncio.create_task(watch_lost(client, v, killed_at)) for v in victims]

        async def create(k: int, d: str) -> str | None:
            target = SERVING + 1 if k % 2 == 0 else SERVING - 1
            body = {"deployment": d, "target_dp_size": target, "commit": "engines", "reason": "fleet bench"}
            started = time.perf_counter()
            response = await client.post("/v1/reconfigurations", json=body)
            load.timed("job creation", (time.perf_counter() - started) * 1000.0, response.status_code == 202)
            if response.status_code != 202:  # refused (a saturated coordinator wrote its engines off)
                print(f"job on {d} refused: {response.text[:300]}", flush=True)
                return None
            return str(response.json()["id"])

        t0 = time.time()
        created = await asyncio.gather(*(create(k, d) for k, d in enumerate(chosen)))
        job_ids = [j for j in created if j is not None]
        streams = [asyncio.create_task(follow_sse(client, load, j)) for j in job_ids]
        jobs: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for j in job_ids:
                if j not in jobs:
                    detail = (await client.get(f"/v1/reconfigurations/{j}")).json()
                    if detail["terminal"]:
                        jobs[j] = detail
            if len(jobs) == len(job_ids):
                break
            await asyncio.sleep(0.5)
        jobs_s = time.time() - t0
        try:
            detections = await asyncio.wait_for(asyncio.gather(*detect), HEARTBEAT_TIMEOUT_S * 4)
        except TimeoutError:
            detections = []  # not detected within 4 timeouts: reported as missing
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*streams, return_exceptions=True), 30)
        # Heal jobs on the deployments whose engine was killed (shrink): until they end, or 60 s.
        heal_jobs: list[dict[str, Any]] = []
        heal_deadline = time.monotonic() + 30
        while healed and time.monotonic() < heal_deadline:
            heal_jobs = []
            for d in healed:
                page = (await client.get("/v1/reconfigurations", params={"deployment": d, "limit": 5})).json()
                heal_jobs += page["data"]
            if len(heal_jobs) >= len(healed) and all(j["terminal"] for j in heal_jobs):
                break
            await asyncio.sleep(1.0)
        load.stop.set()
        await asyncio.gather(*background, return_exceptions=True)
    return {
        "load": load,
        "jobs": jobs,
        "job_ids": job_ids,
        "jobs_wall_s": jobs_s,
        "detections": detections,
        "heal_jobs": heal_jobs,
    }


# ---------------------------------------------------------------------------------------------------
# one size on one database


def gapless(seqs: Sequence[int]) -> bool:
    return bool(seqs) and list(seqs) == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] == 1


def job_figures(detail: dict[str, Any]) -> dict[str, Any]:
    created = str(detail["created_at"])
    finished = str(detail.get("finished_at") or detail["updated_at"])
    duration = (datetime.fromisoformat(finished) - datetime.fromisoformat(created)).total_seconds()
    events = [e["seq"] for e in detail.get("events", [])]
    return {
        "state": detail["state"],
        "duration_s": duration,
        "commit": detail.get("commit"),
        "downtime_ms": detail.get("downtime_ms"),
        "error": (detail.get("error") or {}).get("type"),
        "events": len(events),
        "gapless": gapless(events),
    }


def run_size(kind: str, engines: int, args: argparse.Namespace) -> dict[str, Any]:
    tag = f"{kind[:2]}{engines}"
    scratch = scratch_dir("fleet")
    with database(kind, tag) as url, ProcessGroup(scratch / f"logs-{tag}") as group:
        env = {
            "EPCTL_RUNNER_ENABLED": "true",
            "EPCTL_RUNNER_COORDINATOR_ID": f"fleet-{tag}",
            "EPCTL_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8",  # the receiver is on this machine
        }
        coordinator = ProfiledCoordinator(url, scratch / f"data-{tag}", env=env)
        if os.environ.get("EPCTL_FLEET_PROFILE"):
            coordinator.profile_out = scratch / f"fleet-profile-{tag}.txt"
        coordinator.start(ready_timeout_s=120)
        try:
            pid = coordinator.child.pid  # type: ignore[union-attr]
            api = coordinator.api
            t0 = time.perf_counter()
            fleet = start_fleet(group, api, coordinator.url, engines, tag)
            setup_s = time.perf_counter() - t0
            form_spy = phase_profiler("EPCTL_FLEET_FORM_PYSPY", pid, 60)
            formation = form(api, fleet, timeout_s=180)
            if form_spy is not None:
                form_spy.wait(timeout=90)
            time.sleep(HEARTBEAT_S * 2)  # every agent past its first heartbeat
            idle = idle_phase(api, fleet, pid, args.idle_s)
            beats(fleet, reset=True)
            db0, cpu0, w0 = db_figures(url), cpu_s(pid), time.perf_counter()
            print(f"steady phase: {args.steady_s:g} s", flush=True)  # a profiler attached waits for it
            spy = phase_profiler("EPCTL_FLEET_STEADY_PYSPY", pid, args.steady_s)
            time.sleep(args.steady_s)
            if spy is not None:
                spy.wait(timeout=60)
            cpu1, w1 = cpu_s(pid), time.perf_counter()
            steady = beats(fleet, reset=True)
            db1 = db_figures(url)
            rss_steady = rss_mib(pid)
            # The coordinator's view at the steady phase's end: engines it shows lost (none stopped yet).
            listed = api.get("/v1/engines").json()["data"]
            shown_lost = sum(1 for e in listed if e["state"] not in ("serving", "idle", "paused"))
            now = time.time()
            silent = [e for e, at in steady["last_ok"].items() if now - at > HEARTBEAT_S * 2 + 1]
            # Heard: answered 200 or shed (503 + Retry-After) lately enough for the heartbeat timeout.
            unheard = [e for e, at in steady["last_heard"].items() if now - at > HEARTBEAT_TIMEOUT_S - 2]
            wall = w1 - w0
            hb_cpu_share = (cpu1 - cpu0) / wall
            # the load phase
            webhook_load = Load()
            if not args.load_phase:  # the steady phase only (a saturated size within one hold)
                cpu2 = cpu3 = cpu_s(pid)
                w2, w3 = time.perf_counter(), time.perf_counter() + 1e-9
                out: dict[str, Any] = {
                    "load": Load(),
                    "jobs": {},
                    "job_ids": [],
                    "heal_jobs": [],
                    "detections": [],
                }
            if args.load_phase:
                with webhook_receiver(webhook_load) as hook_url:
                    api.post("/v1/webhooks", json={"url": hook_url}).raise_for_status()
                    cpu2, w2 = cpu_s(pid), time.perf_counter()
                    # K deployments reconfigure, 2 lose an engine, the rest (at least 2) get autoscaler hooks.
                    jobs_at_once = min(args.jobs_at_once, len(fleet.deployments) - 4)
                    out = asyncio.run(load_phase(coordinator.url, fleet, jobs_at_once, 2, args.read_rate_hz))
                    cpu3, w3 = cpu_s(pid), time.perf_counter()
                    time.sleep(2)  # deliveries still in flight
            during = beats(fleet, reset=True)
            db2 = db_figures(url)
            rss_load = rss_mib(pid)
        finally:
            coordinator.stop()
    load: Load = out["load"]
    jobs = [job_figures(d) for d in out["jobs"].values()]
    load_wall = w3 - w2
    # The load phase's CPU beyond what its heartbeats cost at the steady phase's rate: the jobs' and the
    # API's (per job: all of it over the jobs, an upper bound).
    hb_cpu_per_beat_ms = (cpu1 - cpu0) * 1000.0 / max(steady["ok"], 1)
    extra_cpu_s = max(0.0, (cpu3 - cpu2) - during["ok"] * hb_cpu_per_beat_ms / 1000.0)
    sse = list(load.sse.values())
    result = {
        "database": kind,
        "engines": engines,
        "load_phase": args.load_phase,
        "deployments": len(fleet.deployments),
        "setup_s": round(setup_s, 1),
        "formation": formation,
        "steady_s": round(wall, 1),
        "heartbeats_per_s": round(steady["ok"] / wall, 1),
        "heartbeats_failed": steady["failed"] + during["failed"],
        "heartbeats_shed_per_s": round(steady["shed"] / wall, 1),
        "heartbeats_shed_share": round(steady["shed"] / max(steady["shed"] + steady["ok"], 1), 4),
        "heartbeats_shed_load": during["shed"],
        "shed_answer_ms": summarize(steady["shed_ms"]),
        "unheard_engines_in_steady": len(unheard),
        "heartbeats_reregistered": steady["reregistered"] + during["reregistered"],
        "silent_engines_in_steady": len(silent),
        "shown_lost_while_heartbeating": shown_lost,
        "coordinator_cpu_share_idle": idle["cpu_share"],
        "loadavg_idle": idle["loadavg"],
        "active_jobs_idle": idle["active_jobs"],
        "coordinator_cpu_share_steady": round(hb_cpu_share, 4),
        "cpu_per_heartbeat_ms": round(hb_cpu_per_beat_ms, 3),
        "heartbeat_lag_ms": summarize(steady["rtt_ms"]),
        "heartbeat_lag_ms_under_load": summarize(during["rtt_ms"]),
        "rss_mib": {"steady": round(rss_steady, 1), "after_load": round(rss_load, 1)},
        "load_wall_s": round(load_wall, 1),
        "coordinator_cpu_share_load": round((cpu3 - cpu2) / load_wall, 4),
        "cpu_per_job_ms": round(extra_cpu_s * 1000.0 / max(len(jobs), 1), 1),
        "api_ms": {route: summarize(v) for route, v in load.api_ms.items()},
        "api_errors": load.api_errors,
        "jobs": {
            "n": len(out["job_ids"]),
            "terminal": len(jobs),
            "states": _count(j["state"] for j in jobs),
            "duration_s": summarize([j["duration_s"] for j in jobs]),
            "all_gapless": all(j["gapless"] for j in jobs),
            "commit": _count(str(j["commit"]) for j in jobs),
            "errors": _count(str(j["error"]) for j in jobs if j["error"]),
            "downtime_ms": summarize([j["downtime_ms"] for j in jobs if j["downtime_ms"] is not None]),
        },
        "heal_jobs": _count(j["state"] for j in out["heal_jobs"]),
        "sse": {
            "streams": len(sse),
            "gapless": sum(gapless(s["seqs"]) for s in sse),
            "events": sum(len(s["seqs"]) for s in sse),
        },
        "webhooks_received": len(webhook_load.webhook_events),
        "lost_detection_s": summarize(out["detections"]),
        "db_size_mib": round(db2["size_mib"], 2),
        "db_growth_mib_per_min_steady": round((db1["size_mib"] - db0["size_mib"]) * 60 / wall, 3),
    }
    if "rows_written" in db0:
        result["db_rows_written_per_s_steady"] = round((db1["rows_written"] - db0["rows_written"]) / wall, 1)
    return result


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


# ---------------------------------------------------------------------------------------------------


def slope(rows: Sequence[dict[str, Any]], get: Any) -> float:
    """Growth per 1,000 engines between the smallest and the largest size."""
    first, last = rows[0], rows[-1]
    if last["engines"] == first["engines"]:
        return float("nan")
    return (get(last) - get(first)) * 1000.0 / (last["engines"] - first["engines"])


def read_p99(r: dict[str, Any]) -> float:
    reads = [v["p99"] for k, v in r["api_ms"].items() if k.startswith(("dashboard", "cli")) and v.get("n")]
    return max(reads) if reads else float("nan")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--steady-s", type=float, default=30.0)
    parser.add_argument(
        "--idle-s",
        type=float,
        default=6.0,
        help="before the steady phase: the coordinator's CPU this long with every heartbeat paused (0: none)",
    )
    parser.add_argument("--jobs-at-once", type=int, default=16)
    parser.add_argument("--read-rate-hz", type=float, default=10.0, help="dashboard + CLI calls per second")
    parser.add_argument(
        "--no-load-phase",
        dest="load_phase",
        action="store_false",
        help="the steady phase only (a saturated size within one hold of the machine lock)",
    )
    parser.add_argument("--name", default="fleet")
    parser.add_argument(
        "--report-from",
        nargs="+",
        default=[],
        help="write the report from these runs' partial files (a run stopped by its time limit)",
    )
    args = parser.parse_args(argv)
    report = Report(args.name)
    report.parameters = vars(args) | {
        "engines_per_deployment": ENGINES_PER_DEPLOYMENT,
        "serving": SERVING,
        "heartbeat_s": HEARTBEAT_S,
        "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
    }
    rows_by_db: dict[str, list[dict[str, Any]]] = {}
    for path in args.report_from:
        for kind, rows in json.loads(Path(path).read_text()).items():
            rows_by_db.setdefault(kind, []).extend(rows)
    for rows in rows_by_db.values():
        rows.sort(key=lambda r: r["engines"])
    if args.report_from:
        report.command += "  (one report of separate runs: each row's load and time are its own)"
        report.parameters["report_from"] = args.report_from
    for kind in [] if args.report_from else args.databases:
        for engines in sorted(args.sizes):
            print(f"--- {kind}, {engines} engines", flush=True)
            load_before = os.getloadavg()
            row = run_size(kind, engines, args)
            row["loadavg"] = [round(x, 2) for x in os.getloadavg()]
            row["loadavg_before"] = [round(x, 2) for x in load_before]
            rows_by_db.setdefault(kind, []).append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "api_ms"}), flush=True)
            # What was measured so far survives a run stopped later (a timeout, the machine lock's limit).
            partial = scratch_dir("fleet").parent / f"{args.name}-partial.json"
            partial.write_text(json.dumps(rows_by_db, indent=1, default=str))
    report.results["by_database"] = rows_by_db
    all_rows = [r for rows in rows_by_db.values() for r in rows]
    report.add_table(
        "Fleet: steady heartbeats and the load phase",
        [
            "db",
            "engines",
            "depl.",
            "hb/s",
            "shed/s",
            "CPU/hb ms",
            "idle % core",
            "hb % core",
            "lag p50",
            "lag p99",
            "lag p99 load",
            "RSS MiB",
            "read p99",
            "create p99",
            "jobs ok",
            "job p50 s",
            "CPU/job ms",
            "lost detect s",
            "SSE gapless",
            "hooks",
            "DB MiB",
            "load 1m",
        ],
        [
            [
                r["database"],
                r["engines"],
                r["deployments"],
                r["heartbeats_per_s"],
                r.get("heartbeats_shed_per_s", "-"),
                r["cpu_per_heartbeat_ms"],
                "-" if r.get("coordinator_cpu_share_idle") is None else 100 * r["coordinator_cpu_share_idle"],
                100 * r["coordinator_cpu_share_steady"],
                r["heartbeat_lag_ms"].get("p50", "-"),
                r["heartbeat_lag_ms"].get("p99", "-"),
                r["heartbeat_lag_ms_under_load"].get("p99", "-"),
                r["rss_mib"]["after_load"],
                read_p99(r),
                r["api_ms"].get("job creation", {}).get("p99", "-"),
                f"{r['jobs']['states'].get('succeeded', 0)}/{r['jobs']['n']}",
                r["jobs"]["duration_s"].get("p50", "-"),
                r["cpu_per_job_ms"],
                r["lost_detection_s"].get("max", "-"),
                f"{r['sse']['gapless']}/{r['sse']['streams']}",
                r["webhooks_received"],
                r["db_size_mib"],
                r["loadavg"][0],
            ]
            for r in all_rows
        ],
    )
    routes = sorted({k for r in all_rows for k in r["api_ms"]})
    report.add_table(
        "API p50 / p99 per route class (ms), load phase",
        ["db", "engines", *routes],
        [
            [r["database"], r["engines"], *(f"{fmt2(r['api_ms'].get(k, {}))}" for k in routes)]
            for r in all_rows
        ],
    )
    for kind, rows in rows_by_db.items():
        if len(rows) > 1:
            report.results.setdefault("slopes_per_1000_engines", {})[kind] = {
                "cpu_share_steady": round(slope(rows, lambda r: r["coordinator_cpu_share_steady"]), 4),
                "cpu_per_heartbeat_ms": round(slope(rows, lambda r: r["cpu_per_heartbeat_ms"]), 4),
                "heartbeat_lag_p99_ms": round(slope(rows, lambda r: r["heartbeat_lag_ms"]["p99"]), 2),
                "read_p99_ms": round(slope(rows, read_p99), 2),
                "rss_mib": round(slope(rows, lambda r: r["rss_mib"]["after_load"]), 2),
                "cpu_per_job_ms": round(slope(rows, lambda r: r["cpu_per_job_ms"]), 2),
            }
    for kind, rows in rows_by_db.items():
        big = rows[-1]
        at = f"{kind}, {big['engines']} engines"
        report.target(
            f"heartbeats' share of one core, {at}", 100 * big["coordinator_cpu_share_steady"], 25, "%"
        )
        report.target(f"heartbeat-to-record lag p99, {at}", big["heartbeat_lag_ms"].get("p99"), 1000, "ms")
        if big.get("load_phase", True):  # a steady-only row has no API, job or loss figures to judge
            report.target(f"API read p99, {at}", read_p99(big), 100, "ms")
            creation = big["api_ms"].get("job creation", {}).get("p99")
            report.target(f"job creation p99, {at}", creation, 250, "ms")
            report.target(
                f"lost engine detected (max), {at}",
                big["lost_detection_s"].get("max"),  # none detected: `never`
                HEARTBEAT_TIMEOUT_S + 5,
                "s",
                why="the heartbeat timeout + one liveness pass and poll",
            )
            report.target(
                f"jobs not succeeded, {at}", big["jobs"]["n"] - big["jobs"]["states"].get("succeeded", 0), 0
            )
            report.target(f"SSE streams with a gap, {at}", big["sse"]["streams"] - big["sse"]["gapless"], 0)
        report.target(f"engines silent while heartbeating, {at}", big["silent_engines_in_steady"], 0)
        report.target(f"heartbeating engines shown lost, {at}", big["shown_lost_while_heartbeating"], 0)
        if "heartbeats_shed_share" in big:
            report.target(
                f"heartbeating engines unheard (neither recorded nor shed), {at}",
                big["unheard_engines_in_steady"],
                0,
            )
    report.targets_table()
    report.notes.append(
        "The coordinator's time inside each commit window: every job here commits `engines` (armed; the "
        "lightweight agents pause, switch and resume inside the arm call), so no coordinator exchange "
        "falls inside any window by the protocol: 0 ms. What the load can delay is the arm's arrival, "
        "which is outside the window (the job's duration shows it)."
    )
    report.notes.append(
        "CPU per job: the load phase's coordinator CPU less its heartbeats at the steady phase's cost, "
        "over the jobs: an upper bound (it includes the API readers, the SSE streams, the autoscaler "
        "hooks, the heal jobs and the webhook deliveries)."
    )
    report.write()


def fmt2(s: dict[str, Any]) -> str:
    if not s.get("n"):
        return "-"
    return f"{s['p50']:.1f} / {s['p99']:.1f}"


if __name__ == "__main__":
    main()
