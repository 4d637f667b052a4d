"""Lightweight agents for the fan-out benchmark: protocol-compliant, torch-free, trivially fast.

Each agent answers the agent HTTP API of `engine_agent/protocol.py` and moves straight to the next
phase (prepare -> prepared, sync -> synced, pause -> paused, switch -> committed), so a benchmark that
drives them measures only the coordinator's fan-out and the HTTP round trips. Many agents share one
process (one uvicorn server per agent on its own port) so 64 of them fit a 2-core machine.

    .venv/bin/python benchmarks/lightweight_agent.py --count 16 --ready-file F [--generation 1 ...]

writes F as JSON once every server listens: [{"engine_id", "url", "port"}, ...].
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException

from engine_agent import protocol
from engine_agent.protocol import (
    AgentInfo,
    AgentRegistration,
    AgentState,
    CleanupState,
    CleanupStatus,
    EngineConfig,
    InferRequest,
    InferResponse,
    JobRef,
    PauseInterval,
    PauseRequest,
    Platform,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
    Role,
    StoreAddress,
    TransferBackend,
)

# The bounded long-poll of the protocol, where this version of it has one.
LONG_POLL_HEADER: str | None = getattr(protocol, "LONG_POLL_HEADER", None)
MAX_WAIT_S: float = getattr(protocol, "MAX_WAIT_S", 0.0)

# Where the real agent serves each operation. Kept in one table so the fan-out benchmark and these
# agents follow the real agent's routes (engine_agent/main.py) if they move.
ROUTES = {
    "info": "/v1/info",
    "reconfig": "/v1/reconfig",
    "prepare": "/v1/reconfig/prepare",
    "sync": "/v1/reconfig/sync",
    "pause": "/v1/reconfig/pause",
    "switch": "/v1/reconfig/switch",
    "resume": "/v1/reconfig/resume",
    "abort": "/v1/reconfig/abort",
    "cleanup": "/v1/cleanup",
    "cleanup_retry": "/v1/cleanup/retry",
    "cleanup_acknowledge": "/v1/cleanup/acknowledge",
    "infer": "/v1/infer",
    "health": "/healthz",
}


class LightAgent:
    """The state a real agent would keep, minus the engine: generation, rank, phase."""

    def __init__(self, engine_id: str, url: str, generation: int, rank: int | None, world: int) -> None:
        self.engine_id = engine_id
        self.url = url
        self.generation = generation
        self.rank = rank
        self.world_size = world
        self.state = AgentState.serving if rank is not None else AgentState.idle
        self.placement: list[list[int]] = []
        self.reconfig: ReconfigStatus | None = None
        self.prepare: PrepareRequest | None = None
        self.engine = EngineConfig()
        self.pause_started: float | None = None
        self.pause_started_mono: float | None = None
        if rank is not None:
            self.placement = _round_robin(self.engine.num_logical_experts, world)

    def info(self) -> AgentInfo:
        host, port = self.url.removeprefix("http://").split(":")
        return AgentInfo(
            engine_id=self.engine_id,
            url=self.url,
            pid=os.getpid(),
            platform=Platform.cpu,
            device="cpu",
            state=self.state,
            generation=self.generation,
            rank=self.rank,
            world_size=self.world_size,
            warmup_policy=self.prepare.warmup_policy if self.prepare else None,
            placement=self.placement,
            engine=self.engine,
            store=StoreAddress(host=host, port=int(port)),
            transfer_backends=[TransferBackend.gloo],
            serving_steps=0,
            requests_served=0,
            expert_load=[0] * self.engine.num_logical_experts,
            free_kv_bytes=1 << 30,
            reconfig=self.reconfig,
            cleanup=CleanupStatus(state=CleanupState.idle),
        )

    def _status(self, phase: ReconfigPhase, **extra: Any) -> ReconfigStatus:
        assert self.prepare is not None
        members = [m.engine_id for m in self.prepare.members]
        old = [m.engine_id for m in self.prepare.old_members]
        if self.engine_id in members and self.engine_id in old:
            role = Role.staying
        elif self.engine_id in members:
            role = Role.joining
        else:
            role = Role.leaving
        self.reconfig = ReconfigStatus(
            job_id=self.prepare.job_id,
            generation=self.prepare.generation,
            role=role,
            phase=phase,
            warmup_policy=self.prepare.warmup_policy,
            strategy=self.prepare.strategy,
            transfer_backend=self.prepare.transfer_backend,
            updated_at=time.time(),
            **extra,
        )
        return self.reconfig

    def _require(self, job_id: str) -> None:
        if self.prepare is None or self.prepare.job_id != job_id:
            raise HTTPException(409, f"no reconfiguration {job_id} on {self.engine_id}")

    def do_prepare(self, request: PrepareRequest) -> ReconfigStatus:
        self.prepare = request
        return self._status(ReconfigPhase.prepared, steps_done=1, steps_total=1)

    def do_sync(self, ref: JobRef) -> ReconfigStatus:
        self._require(ref.job_id)
        return self._status(ReconfigPhase.synced, synced_value=1 << 30)

    def do_pause(self, request: PauseRequest) -> ReconfigStatus:
        self._require(request.job_id)
        self.pause_started = time.time()
        self.pause_started_mono = time.monotonic()
        if self.state == AgentState.serving:
            self.state = AgentState.paused
        return self._status(ReconfigPhase.paused, pause=PauseInterval(paused_at=self.pause_started))

    def _end_pause(self) -> PauseInterval | None:
        if self.pause_started is None or self.pause_started_mono is None:
            return None
        pause = PauseInterval(
            paused_at=self.pause_started,
            resumed_at=time.time(),
            pause_ms=(time.monotonic() - self.pause_started_mono) * 1000.0,
        )
        self.pause_started = self.pause_started_mono = None
        return pause

    def do_switch(self, ref: JobRef) -> ReconfigStatus:
        self._require(ref.job_id)
        assert self.prepare is not None
        pause = self._end_pause()
        members = [m.engine_id for m in self.prepare.members]
        self.generation = self.prepare.generation
        self.world_size = len(members)
        if self.engine_id in members:
            self.rank = members.index(self.engine_id)
            self.state = AgentState.serving
            self.placement = [list(p) for p in self.prepare.placement]
        else:
            self.rank = None
            self.state = AgentState.idle
            self.placement = []
        return self._status(ReconfigPhase.committed, pause=pause)

    def do_resume(self, ref: JobRef) -> ReconfigStatus:
        self._require(ref.job_id)
        pause = self._end_pause()
        if self.state == AgentState.paused:
            self.state = AgentState.serving
        return self._status(ReconfigPhase.resumed, pause=pause)

    def do_abort(self, ref: JobRef) -> ReconfigStatus:
        self._require(ref.job_id)
        pause = self._end_pause()
        if self.state == AgentState.paused:
            self.state = AgentState.serving
        return self._status(ReconfigPhase.aborted, pause=pause)


def _round_robin(num_logical: int, world: int) -> list[list[int]]:
    per_rank = (num_logical + world - 1) // world
    return [[(r * per_rank + s) % num_logical for s in range(per_rank)] for r in range(world)]


def make_app(agent: LightAgent) -> FastAPI:
    app = FastAPI(title=f"lightweight agent {agent.engine_id}")
    if LONG_POLL_HEADER is not None:
        # Every phase here completes at once, so a bounded long-poll (`wait_s`, `until`) is always
        # answered at once: say so, as a real agent does, so the coordinator uses its long-poll path.
        @app.middleware("http")
        async def long_poll_header(request: Any, call_next: Any) -> Any:
            response = await call_next(request)
            if request.url.path.startswith(ROUTES["reconfig"]):
                response.headers[LONG_POLL_HEADER] = f"{MAX_WAIT_S:g}"
            return response

    @app.get(ROUTES["health"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(ROUTES["info"])
    def info() -> AgentInfo:
        return agent.info()

    @app.get(ROUTES["reconfig"])
    def reconfig() -> ReconfigStatus:
        if agent.reconfig is None:
            raise HTTPException(404, "no reconfiguration")
        return agent.reconfig

    @app.post(ROUTES["prepare"], status_code=202)
    def prepare(request: PrepareRequest) -> ReconfigStatus:
        return agent.do_prepare(request)

    @app.post(ROUTES["sync"], status_code=202)
    def sync(ref: JobRef) -> ReconfigStatus:
        return agent.do_sync(ref)

    @app.post(ROUTES["pause"], status_code=202)
    def pause(request: PauseRequest) -> ReconfigStatus:
        return agent.do_pause(request)

    @app.post(ROUTES["switch"], status_code=202)
    def switch(ref: JobRef) -> ReconfigStatus:
        return agent.do_switch(ref)

    @app.post(ROUTES["resume"], status_code=202)
    def resume(ref: JobRef) -> ReconfigStatus:
        return agent.do_resume(ref)

    @app.post(ROUTES["abort"], status_code=202)
    def abort(ref: JobRef) -> ReconfigStatus:
        return agent.do_abort(ref)

    @app.get(ROUTES["cleanup"])
    def cleanup() -> CleanupStatus:
        return CleanupStatus(state=CleanupState.idle)

    @app.post(ROUTES["cleanup_retry"])
    def cleanup_retry() -> CleanupStatus:
        return CleanupStatus(state=CleanupState.idle)

    @app.post(ROUTES["cleanup_acknowledge"])
    def cleanup_acknowledge() -> CleanupStatus:
        return CleanupStatus(state=CleanupState.idle)

    @app.post(ROUTES["infer"])
    def infer(request: InferRequest) -> InferResponse:
        return InferResponse(
            outputs=request.tokens, generation=agent.generation, rank=agent.rank or 0, step=0
        )

    return app


async def _register(coordinator: str, token: str, deployment: str, agent: LightAgent) -> None:
    import httpx

    body = AgentRegistration(
        engine_id=agent.engine_id,
        deployment=deployment,
        url=agent.url,
        platform=Platform.cpu,
        device="cpu",
        engine=agent.engine,
        generation=agent.generation,
        rank=agent.rank,
    )
    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.post(
            f"{coordinator}/v1/engines",
            json=body.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"},
        )
        response.raise_for_status()


async def serve(args: argparse.Namespace) -> None:
    servers: list[uvicorn.Server] = []
    tasks: list[asyncio.Task[None]] = []
    listing: list[dict[str, Any]] = []
    agents: list[LightAgent] = []
    for index in range(args.count):
        engine_id = f"{args.prefix}{args.first_index + index}"
        # Engines with a global index below --serving form the current generation.
        global_index = args.first_index + index
        rank = global_index if global_index < args.serving else None
        agent = LightAgent(engine_id, "", args.generation if rank is not None else 0, rank, args.serving)
        agents.append(agent)
        # Port 0 through uvicorn's own bind: a socket pre-bound here and handed over with
        # `serve(sockets=...)` measured 44 ms per request (Nagle + delayed ACK) instead of ~1 ms.
        # timeout_keep_alive above httpx's 5 s keep-alive expiry: with uvicorn's default (also 5 s) a
        # connection the coordinator reuses just as the server closes it fails with ReadError (seen with
        # 64 agents, where some sit idle between rounds). Real agents have that race; see the report.
        config = uvicorn.Config(
            make_app(agent),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=args.keep_alive_s,
        )
        server = uvicorn.Server(config)
        servers.append(server)
        tasks.append(asyncio.create_task(server.serve()))
    while not all(s.started for s in servers):
        for task in tasks:
            if task.done():
                task.result()  # re-raise a server that failed to start
        await asyncio.sleep(0.01)
    for agent, server in zip(agents, servers, strict=True):
        port = server.servers[0].sockets[0].getsockname()[1]
        agent.url = f"http://127.0.0.1:{port}"
        listing.append({"engine_id": agent.engine_id, "url": agent.url, "port": port})
    if args.register:
        for agent in agents:
            await _register(args.register, args.token, args.deployment, agent)
    Path(args.ready_file).write_text(json.dumps(listing))
    await asyncio.gather(*tasks)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1, help="agents (uvicorn servers) in this process")
    parser.add_argument("--first-index", type=int, default=0, help="engine index of the first agent")
    parser.add_argument("--serving", type=int, default=0, help="engines with index < this serve generation")
    parser.add_argument("--generation", type=int, default=1)
    parser.add_argument("--prefix", default="light-")
    parser.add_argument("--keep-alive-s", type=int, default=75, help="uvicorn timeout_keep_alive")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--register", default="", help="coordinator URL to register with (POST /v1/engines)")
    parser.add_argument("--token", default="")
    parser.add_argument("--deployment", default="bench")
    args = parser.parse_args()
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
