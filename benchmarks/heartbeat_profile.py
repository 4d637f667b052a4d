"""Where one heartbeat's coordinator time goes (issue 37), in-process: the real app (`create_app`, SQLite,
the job runner off) behind httpx's ASGI transport, one deployment of 16 engines, `--heartbeats`
heartbeats round-robin after a warm-up; then the mean time per heartbeat and, with `--profile`,
cProfile's top functions by cumulative time. No sockets, no other process: the route, its dependencies,
the middleware and the record, nothing else.

    .venv/bin/python benchmarks/heartbeat_profile.py [--heartbeats 2000] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
from sqlmodel import Session

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.api.database import Database  # noqa: E402
from app.core.config import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from tests.support.databases import sqlite_database  # noqa: E402
from tests.support.processes import ADMIN_TOKEN  # noqa: E402

ENGINES = 16
T = TypeVar("T")


async def run(heartbeats: int, profile: bool) -> None:
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
    )
    app = create_app(settings)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c", headers=headers) as http:
            created = await http.post("/v1/deployments", json={"name": "demo", "launcher": "static"})
            created.raise_for_status()
            for i in range(ENGINES):
                body = {
                    "engine_id": f"e{i}",
                    "deployment": "demo",
                    "url": f"http://127.0.0.1:{9000 + i}",
                    "platform": "cpu",
                    "device": "cpu",
                    "engine": {},
                }
                (await http.post("/v1/engines", json=body)).raise_for_status()

            async def beat(n: int) -> None:
                i = n % ENGINES
                body = {"state": "serving", "generation": 1, "rank": i, "world_size": ENGINES}
                answer = await http.post(f"/v1/engines/e{i}/heartbeat", json=body)
                answer.raise_for_status()

            for n in range(200):
                await beat(n)
            profiler = cProfile.Profile() if profile else None
            started, cpu = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            for n in range(heartbeats):
                await beat(n)
            if profiler is not None:
                profiler.disable()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(
        f"{heartbeats} heartbeats: {elapsed / heartbeats * 1e3:.3f} ms each (wall, one at a time), "
        f"{cpu / heartbeats * 1e3:.3f} ms of CPU each (the client's included)"
    )
    if profiler is not None:
        profiler.dump_stats("/tmp/i37/hb.prof")
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(os.environ.get("SORT", "cumulative")).print_stats(45)
        print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--heartbeats", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    asyncio.run(run(args.heartbeats, args.profile))


if __name__ == "__main__":
    main()
