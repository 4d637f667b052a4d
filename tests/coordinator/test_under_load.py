"""Issue 17, findings 1 and 7, against a real coordinator (uvicorn) on SQLite and Postgres: many
simultaneous authenticated requests and event streams get answers, never a 5xx, `/healthz` answers
while they run, a token's streams are bounded (429 beyond), and concurrent retries of a refused request
are refused cleanly. (Latency under load is measured by `benchmarks/load.py`, not asserted here.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.support.fixtures import ADMIN_TOKEN
from tests.support.processes import Coordinator

# The database's own behaviour is part of what these check (tests/support/databases.py).
pytestmark = pytest.mark.databases("sqlite", "postgres")

REQUESTS = 150
STREAMS_PER_TOKEN = 50
TOKENS = 4


def make_tokens(running: Coordinator, count: int, role: str = "viewer") -> list[str]:
    with running.client() as api:
        return [
            api.post("/v1/tokens", json={"name": f"{role}-{i}", "role": role}).json()["token"]
            for i in range(count)
        ]


def make_pending_job(running: Coordinator) -> str:
    with running.client() as api:
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
            assert api.post("/v1/engines", json=registration).status_code == 201
        job = api.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2})
        assert job.status_code == 202, job.text
        return str(job.json()["id"])


def client(running: Coordinator, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=running.url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx.Timeout(120.0),
        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=0),
    )


@pytest.mark.processes
def test_simultaneous_requests_and_streams_never_get_a_5xx(database_url: str, tmp_path: Path) -> None:
    with Coordinator(database_url, tmp_path / "data") as running:
        job_id = make_pending_job(running)
        tokens = make_tokens(running, TOKENS)

        async def go() -> None:
            async with client(running, tokens[0]) as api:
                paths = ["/v1/reconfigurations", f"/v1/reconfigurations/{job_id}", "/v1/deployments/demo"]
                answers = await asyncio.gather(*(api.get(paths[i % 3]) for i in range(REQUESTS)))
                statuses = [r.status_code for r in answers]
                assert statuses == [200] * REQUESTS, sorted(set(statuses))

            opened: list[int] = []
            release = asyncio.Event()

            async def stream(api: httpx.AsyncClient) -> None:
                async with api.stream("GET", f"/v1/reconfigurations/{job_id}/events") as response:
                    opened.append(response.status_code)
                    if response.status_code == 200:
                        await release.wait()

            clients = [client(running, token) for token in tokens]
            tasks = [asyncio.create_task(stream(api)) for api in clients for _ in range(STREAMS_PER_TOKEN)]
            try:
                while len(opened) < len(tasks):
                    await asyncio.sleep(0.1)
                    assert not any(t.done() and t.exception() for t in tasks), [t.exception() for t in tasks]
                assert opened == [200] * len(tasks), sorted(set(opened))
                async with httpx.AsyncClient(base_url=running.url, timeout=30.0) as probe:
                    assert (await probe.get("/healthz")).status_code == 200
                    viewer = {"Authorization": f"Bearer {tokens[0]}"}
                    assert (await probe.get("/v1/reconfigurations", headers=viewer)).status_code == 200
                    # The first token holds 50 streams; the default bound is 64 per token.
                    extra = [
                        probe.stream("GET", f"/v1/reconfigurations/{job_id}/events", headers=viewer)
                        for _ in range(15)
                    ]
                    statuses = []
                    for context in extra:
                        response = await context.__aenter__()
                        statuses.append(response.status_code)
                    assert statuses.count(200) == 14 and statuses[-1] == 429, statuses
                    assert response.headers["content-type"] == "application/problem+json"
                    for context in extra:
                        await context.__aexit__(None, None, None)
            finally:
                release.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                for api in clients:
                    await api.aclose()

        asyncio.run(go())
        assert "Traceback" not in running.log_tail(), running.log_tail()


@pytest.mark.processes
def test_concurrent_retries_of_a_refused_request_are_refused_cleanly(
    database_url: str, tmp_path: Path
) -> None:
    with Coordinator(database_url, tmp_path / "data") as running:
        make_pending_job(running)  # demo now has an active job

        async def go() -> None:
            async with client(running, ADMIN_TOKEN) as api:
                refused = {"deployment": "demo", "target_dp_size": 999}
                same_key = {"Idempotency-Key": "retry-me"}
                answers = await asyncio.gather(
                    *(api.post("/v1/reconfigurations", json=refused, headers=same_key) for _ in range(100)),
                    *(
                        api.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 1})
                        for _ in range(100)
                    ),
                )
            statuses = sorted({r.status_code for r in answers})
            assert all(400 <= s < 500 for s in statuses), statuses

        asyncio.run(go())
