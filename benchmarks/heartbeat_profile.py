"""Where one heartbeat's coordinator time goes (issue 37), in-process: the real app (`create_app`, SQLite,
the job runner off), one deployment of 16 engines registered through httpx's ASGI transport, then
`--heartbeats` heartbeats round-robin after a warm-up, each one ASGI call of the app as uvicorn makes it
(the same scope and messages; no client library's own cost in the figure); then the mean CPU per
heartbeat and, with `--profile`, cProfile's top functions by cumulative time. No sockets, no other
process: the middleware, the route (or the fast path, `app.deployments.engines.fast_path`), the record,
nothing else; the HTTP server's own share is `benchmarks/fleet.py`'s. `--no-fast-path`: every heartbeat
through FastAPI's route (`EPCTL_HEARTBEAT_FAST_PATH=false`).

    .venv/bin/python benchmarks/heartbeat_profile.py [--heartbeats 2000] [--concurrency 16] [--no-fast-path]
        [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlmodel import Session

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.api.database import Database  # noqa: E402
from app.core.config import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from tests.support.databases import sqlite_database  # noqa: E402
from tests.support.fleet import fleet_calls  # noqa: E402
from tests.support.processes import ADMIN_TOKEN  # noqa: E402

ENGINES = 16
T = TypeVar("T")


async def call(app: Any, path: str, body: bytes) -> int:
    """One request as uvicorn hands it to the app: the status of its answer."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"authorization", f"Bearer {ADMIN_TOKEN}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    given = False
    never = asyncio.Event()
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def run(heartbeats: int, profile: bool, fast_path: bool, concurrency: int = 1) -> None:
    if profile:  # cProfile sees one thread: the database work runs on the loop's own (in the profile only)

        async def inline(self: Database, work: Callable[[Session], T]) -> T:
            with self.session() as session:
                return work(session)

        Database.run = inline  # type: ignore[method-assign]
    directory = Path(tempfile.mkdtemp(prefix="hb-profile-"))
    settings = Settings(
        database_url=sqlite_database(directory, migrated=True),
        data_dir=directory / "data",
        admin_token=ADMIN_TOKEN,
        auto_migrate=False,
        runner_enabled=False,
        webhook_worker_enabled=False,
        heartbeat_fast_path=fast_path,
    )
    app = create_app(settings, freeze_heap=True)  # as `uvicorn app.main:app` and `epctl serve` run it
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c", headers=headers) as http:
            for path, body in fleet_calls(ENGINES):
                (await http.post(path, json=body)).raise_for_status()

            async def beat(n: int) -> None:
                i = n % ENGINES
                body = {"state": "serving", "generation": 1, "rank": i, "world_size": ENGINES}
                status = await call(app, f"/v1/engines/e{i}/heartbeat", json.dumps(body).encode())
                assert status == 200, status

            for n in range(200):
                await beat(n)
            profiler = cProfile.Profile() if profile else None
            started, cpu = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            for n in range(0, heartbeats, concurrency):  # `concurrency` at once: one batch's worth
                await asyncio.gather(*(beat(k) for k in range(n, min(n + concurrency, heartbeats))))
            if profiler is not None:
                profiler.disable()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(
        f"{heartbeats} heartbeats ({'fast path' if fast_path else 'FastAPI route'}, {concurrency} at once): "
        f"{elapsed / heartbeats * 1e3:.3f} ms each (wall, one at a time), "
        f"{cpu / heartbeats * 1e3:.3f} ms of CPU each"
    )
    if profiler is not None:
        Path("/tmp/i37").mkdir(exist_ok=True)
        profiler.dump_stats("/tmp/i37/hb.prof")
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(os.environ.get("SORT", "cumulative")).print_stats(45)
        print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--heartbeats", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--concurrency", type=int, default=1, help="heartbeats sent at once (a batch)")
    parser.add_argument("--no-fast-path", dest="fast_path", action="store_false")
    args = parser.parse_args()
    asyncio.run(run(args.heartbeats, args.profile, args.fast_path, args.concurrency))


if __name__ == "__main__":
    main()
