"""Issue 17: the coordinator under load, as an attacker or a buggy autoscaler would load it.

For each database (SQLite, Postgres): start the real coordinator (uvicorn `app.main:app`, runner off,
webhook worker on) on loopback, seed a deployment with a pending job and viewer tokens, then

1. **baseline**: `/healthz` and an authenticated list, unloaded;
2. **requests**: 500 authenticated requests sent at once (lists, job details, deployments; one
   connection each);
3. **streams**: 1,000 SSE streams on the pending job opened at once (20 viewer tokens x 50, under the
   default bound of 64 per token), held open for a few seconds while 100 more authenticated requests
   are made, then closed; plus one token pushed past its bound (its extra streams must get 429);
4. **recovery**: once the load stops, how long until an authenticated request is back at its baseline
   latency (five in a row under max(2 x baseline p99, baseline p99 + 20 ms)).

A separate prober process hits `/healthz` on a fresh connection every 20 ms from before the first
burst to after recovery, so its latencies carry no delay of the load generator's own event loop. The
load generator speaks HTTP/1.1 over raw asyncio streams (a client library's per-call CPU would
otherwise dominate on 2 cores).

    .venv/bin/python benchmarks/load.py                      # both databases
    .venv/bin/python benchmarks/load.py --databases sqlite

Targets: 0 5xx; `/healthz` p99 < 100 ms throughout; recovery within 5 s after the load stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from common import PYTHON, ProcessGroup, Report, free_port, percentile, scratch_dir

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
ADMIN_TOKEN = "bench-admin-" + secrets.token_hex(12)
HOST = "127.0.0.1"
REQUESTS = 500
STREAM_TOKENS = 20
STREAMS_PER_TOKEN = 50
HOLD_S = 5.0
PROBE_INTERVAL_S = 0.02
IO_TIMEOUT_S = 180.0


# ---------------------------------------------------------------------------------------------------
# raw HTTP/1.1 over asyncio streams


async def http_get(port: int, path: str, token: str | None = None) -> tuple[int, float]:
    """(status or -1 on a connection error, latency ms) of one GET on a fresh connection."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(IO_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(HOST, port)
            auth = f"Authorization: Bearer {token}\r\n" if token else ""
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n{auth}Connection: close\r\n\r\n".encode())
            await writer.drain()
            status_line = await reader.readline()
            await reader.read()  # Connection: close - the body ends with the connection
            writer.close()
            status = int(status_line.split()[1]) if status_line else -1
    except (OSError, TimeoutError, ValueError, IndexError):
        status = -1
    return status, (time.perf_counter() - started) * 1000


class Stream:
    """One SSE stream: opened, its status read, held until closed."""

    def __init__(self, port: int, path: str, token: str) -> None:
        self.port, self.path, self.token = port, path, token
        self.status = 0
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> int:
        try:
            async with asyncio.timeout(IO_TIMEOUT_S):
                reader, self.writer = await asyncio.open_connection(HOST, self.port)
                self.writer.write(
                    f"GET {self.path} HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {self.token}\r\n"
                    "Accept: text/event-stream\r\n\r\n".encode()
                )
                await self.writer.drain()
                status_line = await reader.readline()
                self.status = int(status_line.split()[1]) if status_line else -1
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass  # headers
        except (OSError, TimeoutError, ValueError, IndexError):
            self.status = -1
        return self.status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# ---------------------------------------------------------------------------------------------------
# the /healthz prober (a process of its own)


def probe(port: int, out: Path, stop_file: Path) -> None:
    """Until `stop_file` exists: GET /healthz on a fresh connection every 20 ms; write (t, status, ms)."""

    async def run() -> list[tuple[float, int, float]]:
        samples: list[tuple[float, int, float]] = []
        while not stop_file.exists():
            started = time.time()
            status, ms = await http_get(port, "/healthz")
            samples.append((started, status, ms))
            await asyncio.sleep(max(0.0, PROBE_INTERVAL_S - ms / 1000))
        return samples

    out.write_text(json.dumps(asyncio.run(run())))


# ---------------------------------------------------------------------------------------------------
# one database


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    import psycopg

    name = f"epctl_bench_load_{os.getpid()}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def sqlite_database() -> Iterator[str]:
    path = scratch_dir("load") / "coordinator.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    yield f"sqlite:///{path}"


def seed(url: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as api:
        deployment = api.post("/v1/deployments", json={"name": "demo", "launcher": "static"}).json()
        for index in range(2):
            registration = {
                "engine_id": f"demo-e{index}",
                "deployment": "demo",
                "url": "http://127.0.0.1:9",
                "platform": "cpu",
                "device": "cpu",
                "engine": deployment["engine"],
            }
            api.post("/v1/engines", json=registration).raise_for_status()
        job = api.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2})
        job.raise_for_status()
        tokens = [
            api.post("/v1/tokens", json={"name": f"viewer-{i}", "role": "viewer"}).json()["token"]
            for i in range(STREAM_TOKENS + 1)
        ]
    return {"job_id": job.json()["id"], "tokens": tokens}


def statuses_table(counts: Counter[int]) -> str:
    return ", ".join(f"{status if status > 0 else 'conn-error'}: {n}" for status, n in sorted(counts.items()))


async def load(port: int, job_id: str, tokens: list[str]) -> dict[str, Any]:
    reader = tokens[-1]
    paths = ["/v1/reconfigurations?limit=20", f"/v1/reconfigurations/{job_id}", "/v1/deployments/demo"]
    result: dict[str, Any] = {}

    baseline = [await http_get(port, paths[0], reader) for _ in range(30)]
    result["baseline_list_ms"] = {
        "p50": percentile([ms for _, ms in baseline], 50),
        "p99": percentile([ms for _, ms in baseline], 99),
    }

    # 2. 500 authenticated requests at once
    result["requests_started"] = time.time()
    started = time.perf_counter()
    answers = await asyncio.gather(*(http_get(port, paths[i % 3], reader) for i in range(REQUESTS)))
    result["requests_wall_s"] = time.perf_counter() - started
    result["requests_statuses"] = Counter(status for status, _ in answers)
    latencies = [ms for _, ms in answers]
    result["requests_ms"] = {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}

    # 3. 1,000 SSE streams at once, held while more requests run
    result["streams_started"] = time.time()
    events = f"/v1/reconfigurations/{job_id}/events"
    streams = [
        Stream(port, events, tokens[i // STREAMS_PER_TOKEN]) for i in range(STREAM_TOKENS * STREAMS_PER_TOKEN)
    ]
    started = time.perf_counter()
    opened = await asyncio.gather(*(s.open() for s in streams))
    result["streams_open_wall_s"] = time.perf_counter() - started
    result["streams_statuses"] = Counter(opened)
    over = [Stream(port, events, tokens[0]) for _ in range(20)]  # token 0 already holds 50 of its 64
    result["over_bound_statuses"] = Counter(await asyncio.gather(*(s.open() for s in over)))
    result["streams_opened"] = time.time()
    during = await asyncio.gather(*(http_get(port, paths[i % 3], reader) for i in range(100)))
    result["during_streams_statuses"] = Counter(status for status, _ in during)
    result["during_streams_ms"] = {
        "p50": percentile([ms for _, ms in during], 50),
        "p99": percentile([ms for _, ms in during], 99),
    }
    await asyncio.sleep(HOLD_S)
    for stream in streams + over:
        stream.close()
    load_stopped = time.time()
    result["load_stopped"] = load_stopped

    # 4. recovery: five authenticated requests in a row at baseline latency
    threshold = max(2 * result["baseline_list_ms"]["p99"], result["baseline_list_ms"]["p99"] + 20)
    in_a_row, recovered_at = 0, None
    after: list[tuple[float, int, float]] = []
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:
        status, ms = await http_get(port, paths[0], reader)
        after.append((time.time() - load_stopped, status, ms))
        in_a_row = in_a_row + 1 if status == 200 and ms <= threshold else 0
        if in_a_row == 5:
            recovered_at = time.time() - load_stopped
            break
        await asyncio.sleep(0.05)
    result["recovery_threshold_ms"] = threshold
    result["recovery_s"] = recovered_at
    result["after_statuses"] = Counter(status for _, status, _ in after)
    return result


def run_database(kind: str, database_url: str, report: Report) -> dict[str, Any]:
    scratch = scratch_dir(f"load-{kind}")
    port = free_port()
    url = f"http://{HOST}:{port}"
    env = {
        "DATABASE_URL": database_url,
        "EPCTL_ADMIN_TOKEN": ADMIN_TOKEN,
        "EPCTL_DATA_DIR": str(scratch / "data"),
        "EPCTL_RUNNER_ENABLED": "false",
    }
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EPCTL_")}, **env}
    server_argv = [PYTHON, "-m", "uvicorn", "app.main:app", "--host", HOST, "--port", str(port)]
    server_argv += ["--log-level", "warning", "--backlog", "4096", "--timeout-keep-alive", "5"]
    with ProcessGroup(scratch) as group:
        server = group.start("coordinator", server_argv, env=env)
        server.wait_for(
            lambda: httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200,
            timeout_s=90,
            what="the coordinator to be ready",
        )
        seeded = seed(url)
        stop_file = scratch / "probe.stop"
        stop_file.unlink(missing_ok=True)
        probe_out = scratch / "probe.json"
        prober = group.start(
            "prober", [PYTHON, __file__, "--probe", str(port), str(probe_out), str(stop_file)]
        )
        time.sleep(3.0)  # the prober's baseline
        result = asyncio.run(load(port, seeded["job_id"], seeded["tokens"]))
        time.sleep(1.0)
        stop_file.touch()
        prober.popen.wait(timeout=60)
        samples = json.loads(probe_out.read_text())
        server_log = server.log_tail(40)
    during = [(t, s, ms) for t, s, ms in samples if result["requests_started"] <= t <= result["load_stopped"]]
    before = [(t, s, ms) for t, s, ms in samples if t < result["requests_started"]]
    result["healthz_baseline_ms"] = {
        "p50": percentile([m for *_, m in before], 50),
        "p99": percentile([m for *_, m in before], 99),
    }
    result["healthz_during_ms"] = {
        "n": len(during),
        "p50": percentile([m for *_, m in during], 50),
        "p99": percentile([m for *_, m in during], 99),
        "max": max((m for *_, m in during), default=0.0),
    }
    result["healthz_statuses"] = Counter(s for _, s, _ in samples)
    phases = {
        "requests burst": (result["requests_started"], result["streams_started"]),
        "streams opening": (result["streams_started"], result["streams_opened"]),
        "streams held": (result["streams_opened"], result["load_stopped"]),
    }
    result["healthz_by_phase_ms"] = {
        name: {
            "n": len(ms := [m for t, _, m in samples if start <= t < end]),
            "p50": percentile(ms, 50) if ms else 0.0,
            "p99": percentile(ms, 99) if ms else 0.0,
        }
        for name, (start, end) in phases.items()
    }
    result["server_errors_logged"] = server_log.count("Traceback")
    five_xx = sum(
        n
        for key in (
            "requests_statuses",
            "streams_statuses",
            "during_streams_statuses",
            "after_statuses",
            "healthz_statuses",
            "over_bound_statuses",
        )
        for status, n in result[key].items()
        if status >= 500
    )
    failed_connections = sum(
        n
        for key in ("requests_statuses", "streams_statuses", "during_streams_statuses", "healthz_statuses")
        for status, n in result[key].items()
        if status < 0
    )
    result["five_xx"] = five_xx
    result["connection_errors"] = failed_connections
    report.add_table(
        f"{kind}: load and answers",
        ["phase", "answers", "p50 ms", "p99 ms", "wall s"],
        [
            [
                "baseline list (sequential)",
                "30 x 200",
                result["baseline_list_ms"]["p50"],
                result["baseline_list_ms"]["p99"],
                "",
            ],
            [
                f"{REQUESTS} requests at once",
                statuses_table(result["requests_statuses"]),
                result["requests_ms"]["p50"],
                result["requests_ms"]["p99"],
                result["requests_wall_s"],
            ],
            [
                f"{sum(result['streams_statuses'].values())} SSE streams at once",
                statuses_table(result["streams_statuses"]),
                "",
                "",
                result["streams_open_wall_s"],
            ],
            [
                "20 more streams on a token holding 50",
                statuses_table(result["over_bound_statuses"]),
                "",
                "",
                "",
            ],
            [
                "100 requests while the streams are open",
                statuses_table(result["during_streams_statuses"]),
                result["during_streams_ms"]["p50"],
                result["during_streams_ms"]["p99"],
                "",
            ],
            [
                "/healthz before the load",
                "",
                result["healthz_baseline_ms"]["p50"],
                result["healthz_baseline_ms"]["p99"],
                "",
            ],
            [
                f"/healthz during the load ({result['healthz_during_ms']['n']} probes)",
                statuses_table(result["healthz_statuses"]),
                result["healthz_during_ms"]["p50"],
                result["healthz_during_ms"]["p99"],
                "",
            ],
            [
                "recovery after the load stops",
                statuses_table(result["after_statuses"]),
                "",
                "",
                result["recovery_s"],
            ],
        ],
    )
    report.target(f"{kind}: 5xx answers", five_xx, 0, "", "every request, stream, probe and recovery request")
    report.target(f"{kind}: connection errors", failed_connections, 0, "")
    report.target(f"{kind}: /healthz p99 during the load", result["healthz_during_ms"]["p99"], 100, "ms")
    report.target(
        f"{kind}: recovery to baseline latency",
        result["recovery_s"] if result["recovery_s"] is not None else 999.0,
        5.0,
        "s",
    )
    report.target(
        f"{kind}: streams past a token's bound refused with 429",
        result["over_bound_statuses"].get(429, 0),
        6,
        "",
        at_least=True,
    )
    return {key: (dict(value) if isinstance(value, Counter) else value) for key, value in result.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--databases", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"]
    )
    parser.add_argument("--probe", nargs=3, metavar=("PORT", "OUT", "STOP_FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        probe(int(args.probe[0]), Path(args.probe[1]), Path(args.probe[2]))
        return
    report = Report("load")
    report.parameters = {
        "requests_at_once": REQUESTS,
        "streams_at_once": STREAM_TOKENS * STREAMS_PER_TOKEN,
        "stream_tokens": STREAM_TOKENS,
        "hold_s": HOLD_S,
        "probe_interval_s": PROBE_INTERVAL_S,
    }
    for kind in args.databases:
        with sqlite_database() if kind == "sqlite" else postgres_database() as database_url:
            print(f"== {kind} (load average {os.getloadavg()[0]:.2f})", flush=True)
            report.results[kind] = run_database(kind, database_url, report)
            report.results[kind]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    report.targets_table()
    report.notes.append(
        "Load generator, prober and coordinator share the same 2 cores; the load average at the start "
        f"was {report.machine.get('loadavg_at_start')}."
    )
    report.write()
    sys.exit(0 if all(t["met"] for t in report.targets) else 1)


if __name__ == "__main__":
    main()
