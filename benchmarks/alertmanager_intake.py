"""One large Alertmanager notification against a real coordinator process: how long it takes and how
many hook records it writes (issue 25 item 8 measured one 2,000-alert post at 24 s on SQLite and 42 s on
Postgres, writing 2,000 rows).

Two shapes, each a fresh firing episode per round (so nothing is a duplicate):
- `spread`: 2,000 alerts, each naming a deployment of its own that does not exist (the worst case: one
  record per deployment named, before the cap);
- `one-group`: 2,000 per-instance alerts of one group naming one deployment.

    .venv/bin/python benchmarks/alertmanager_intake.py                      # SQLite and Postgres, 3 rounds
    .venv/bin/python benchmarks/alertmanager_intake.py --databases sqlite --rounds 1

Targets: a 2,000-alert post answers within 2 s (p50) and writes at most 50 records, on both databases.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from common import Report, scratch_dir, summarize

from tests.operators.alertmanager_payloads import alert, payload
from tests.support.databases import postgres_schema, sqlite_database
from tests.support.processes import Coordinator


@contextmanager
def database(kind: str) -> Iterator[str]:
    if kind == "postgres":
        with postgres_schema(migrated=True) as url:
            yield url
    else:
        directory = scratch_dir("alertmanager_intake") / f"sqlite-{time.time_ns()}"
        directory.mkdir(parents=True, exist_ok=True)
        yield sqlite_database(directory, migrated=True)


def body(shape: str, alerts: int, round_index: int) -> dict[str, Any]:
    starts = f"2026-12-02T0{round_index}:00:00.000Z"
    if shape == "spread":
        items = [
            alert(deployment=f"ghost-{i}", labels={"scale": "up"}, starts_at=starts) for i in range(alerts)
        ]
    else:
        items = [
            alert(deployment="d1", labels={"scale": "up", "instance": f"i{i}"}, starts_at=starts)
            for i in range(alerts)
        ]
    return payload(items, group_key=f'{{}}:{{alertname="MoEQueueTooLong",round="{round_index}"}}')


def one_database(kind: str, alerts: int, rounds: int) -> dict[str, dict[str, Any]]:
    measured: dict[str, dict[str, Any]] = {}
    with database(kind) as url:
        env = {"EPCTL_RUNNER_ENABLED": "false", "EPCTL_WEBHOOK_WORKER_ENABLED": "false"}
        with Coordinator(url, scratch_dir("alertmanager_intake") / f"coordinator-{kind}", env=env) as live:
            admin = live.api
            admin.post("/v1/deployments", json={"name": "d1", "max_dp_size": 8}).raise_for_status()
            token = admin.post("/v1/tokens", json={"name": "am", "role": "autoscaler"}).json()["token"]
            headers = {"Authorization": f"Bearer {token}"}
            for shape in ("spread", "one-group"):
                seconds: list[float] = []
                rows: list[int] = []
                statuses: set[int] = set()
                for round_index in range(rounds):
                    before = admin.get("/v1/hooks/requests", params={"limit": 1}).json()["count"]
                    document = body(shape, alerts, round_index)
                    started = time.perf_counter()
                    answer = httpx.post(
                        f"{live.url}/v1/hooks/alertmanager", json=document, headers=headers, timeout=300
                    )
                    seconds.append(time.perf_counter() - started)
                    statuses.add(answer.status_code)
                    after = admin.get("/v1/hooks/requests", params={"limit": 1}).json()["count"]
                    rows.append(int(after) - int(before))
                measured[shape] = {
                    "seconds": summarize(seconds),
                    "rows": max(rows),
                    "statuses": sorted(statuses),
                }
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--alerts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--databases", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"]
    )
    args = parser.parse_args()
    report = Report("alertmanager_intake")
    report.parameters = vars(args)
    table_rows = []
    for kind in args.databases:
        measured = one_database(kind, args.alerts, args.rounds)
        report.results[kind] = measured
        for shape, figures in measured.items():
            table_rows.append(
                [
                    kind,
                    shape,
                    figures["seconds"]["p50"],
                    figures["seconds"]["max"],
                    figures["rows"],
                    figures["statuses"],
                ]
            )
            report.target(
                f"{kind}, {shape}: one {args.alerts}-alert post (p50)",
                figures["seconds"]["p50"],
                2.0,
                "s",
                why="issue 25: 24 s (SQLite) / 42 s (Postgres) before",
            )
            report.target(f"{kind}, {shape}: hook records written by one post", figures["rows"], 50)
    report.add_table(
        f"One Alertmanager notification of {args.alerts} alerts ({args.rounds} rounds)",
        ["database", "shape", "seconds (p50)", "max", "records written", "HTTP status"],
        table_rows,
    )
    report.targets_table()
    report.write()


if __name__ == "__main__":
    main()
