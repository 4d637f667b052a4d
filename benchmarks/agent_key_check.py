"""What the agent key costs per agent call (issues 25 and 32): the check alone (SHA-256 of the presented
key, constant-time compares against the current and previous digests); the gate alone
(`engine_agent.gate.AgentGate` around an app that does nothing: the key from the headers, the failure
throttle's lookup and bookkeeping); and a whole request through the gate against the same route
without it, interleaved in rounds, in-process over ASGI (no sockets: the difference is the check, not
the network; on a loaded machine it drowns in noise, which the gate alone does not).

    .venv/bin/python benchmarks/agent_key_check.py [--requests 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
import timeit
from typing import Any

import httpx
from fastapi import APIRouter, Depends, FastAPI

from engine_agent.auth import AgentKeys, Need, require_control_key
from engine_agent.gate import AgentGate, Guard


def app_with(keys: AgentKeys | None) -> FastAPI:
    app = FastAPI()
    router = APIRouter()

    @router.get("/v1/info")
    def info() -> dict[str, int]:
        return {"generation": 1}

    if keys is not None:
        guard = Guard(keys)
        app.add_middleware(AgentGate, guard_of=lambda: guard)
    app.include_router(router, dependencies=[Depends(require_control_key)] if keys is not None else [])
    return app


async def per_request_us(app: FastAPI, headers: dict[str, str], count: int) -> float:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent", headers=headers) as http:
        for _ in range(50):
            (await http.get("/v1/info")).raise_for_status()
        started = time.perf_counter()
        for _ in range(count):
            (await http.get("/v1/info")).raise_for_status()
        return (time.perf_counter() - started) / count * 1e6


async def gate_alone_us(keys: AgentKeys, key: str, count: int) -> float:
    """The gate's own cost per call: around an ASGI app that does nothing, minus that app alone."""

    async def nothing(scope: Any, receive: Any, send: Any) -> None:
        return None

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    guard = Guard(keys)
    gate = AgentGate(nothing, guard_of=lambda: guard)
    headers = [(b"authorization", f"Bearer {key}".encode())]
    scope = {
        "type": "http",
        "path": "/v1/info",
        "method": "GET",
        "client": ("127.0.0.1", 1),
        "headers": headers,
    }
    for _ in range(1000):
        await gate(dict(scope), receive, send)
    started = time.perf_counter()
    for _ in range(count):
        await gate(dict(scope), receive, send)
    gated = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(count):
        await nothing(dict(scope), receive, send)
    return (gated - (time.perf_counter() - started)) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    key = "epak_" + secrets.token_urlsafe(32)
    keys = AgentKeys(key, previous="epak_" + secrets.token_urlsafe(32), previous_until=time.time() + 3600)
    checks = 100_000
    check_us = min(timeit.repeat(lambda: keys.accepts(Need.control, key), number=checks, repeat=7))
    print(f"the check alone: {check_us / checks * 1e6:.2f} us (best of 7 x {checks})")
    gate_us = min(asyncio.run(gate_alone_us(keys, key, 20_000)) for _ in range(5))
    print(f"the gate alone: {gate_us:.1f} us per call (best of 5 x 20000)")
    with_key, without = [], []
    for _ in range(args.rounds):
        with_key.append(
            asyncio.run(per_request_us(app_with(keys), {"Authorization": f"Bearer {key}"}, args.requests))
        )
        without.append(asyncio.run(per_request_us(app_with(None), {}, args.requests)))
    a, b = statistics.median(with_key), statistics.median(without)
    print(
        f"a request through ASGI, median of {args.rounds} interleaved rounds x {args.requests}: "
        f"with the gate {a:.1f} us, without {b:.1f} us, difference {a - b:.1f} us"
    )


if __name__ == "__main__":
    main()
