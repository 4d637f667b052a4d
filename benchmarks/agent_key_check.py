"""What the agent key costs per agent call (issues 25 and 32): the check alone (SHA-256 of the presented
key, constant-time compares against the current and previous digests), and a whole request through the
agent's own gate (`engine_agent.gate.AgentGate`: the key from the headers, the failure throttle's
lookup, the route dependency) against the same route without it, interleaved in rounds, in-process over
ASGI (no sockets: the difference is the check, not the network).

    .venv/bin/python benchmarks/agent_key_check.py [--requests 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
import timeit

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
