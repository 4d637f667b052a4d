"""Lightweight agents for the fan-out benchmark: protocol-compliant, torch-free, trivially fast.

Each agent answers the agent HTTP API of `engine_agent/protocol.py` and moves straight to each call's
end phase (the protocol's `MOVES`: prepare -> prepared, sync -> synced, pause -> paused, switch ->
committed), so a benchmark that
drives them measures only the coordinator's fan-out and the HTTP round trips. Many agents share one
process (one aiohttp.web server per agent on its own port, far cheaper per request than FastAPI) so
hundreds of them fit a few cores.

    .venv/bin/python benchmarks/lightweight_agent.py --count 16 --ready-file F [--generation 1 ...]

writes F as JSON once every server listens: [{"engine_id", "url", "port"}, ...].
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from engine_agent import tensor_wire
from engine_agent.coordinators import next_heartbeat_s, shed_retry_after_s
from engine_agent.protocol import (
    LONG_POLL_HEADER,
    MAX_WAIT_S,
    MOVES,
    AgentInfo,
    AgentRegistration,
    AgentState,
    ArmRequest,
    CleanupState,
    CleanupStatus,
    EngineConfig,
    InferRequest,
    InferResponse,
    JobRef,
    Operation,
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

ModelT = TypeVar("ModelT", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.Response]]

# Where the real agent serves each call (a reconfiguration call's path is the protocol's). Kept in one
# table so the fan-out benchmark and these agents follow the real agent's routes if they move.
ROUTES = {
    "info": "/v1/info",
    "reconfig": "/v1/reconfig",
    **{operation.value: operation.path for operation in Operation},
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
        self.key_check: str | None = None  # the fingerprint of the deployment's agent key (heartbeats)
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
        self.reconfig = ReconfigStatus(
            job_id=self.prepare.job_id,
            generation=self.prepare.generation,
            role=self.prepare.role_of(self.engine_id) or Role.leaving,
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
            raise Refused(f"no reconfiguration {job_id} on {self.engine_id}")

    def do_prepare(self, request: PrepareRequest) -> ReconfigStatus:
        self.prepare = request
        return self._status(MOVES[Operation.prepare].done, steps_done=1, steps_total=1)

    def do_sync(self, ref: JobRef) -> ReconfigStatus:
        self._require(ref.job_id)
        return self._status(MOVES[Operation.sync].done, synced_value=1 << 30)

    def do_pause(self, request: PauseRequest) -> ReconfigStatus:
        self._require(request.job_id)
        self.pause_started = time.time()
        self.pause_started_mono = time.monotonic()
        if self.state == AgentState.serving:
            self.state = AgentState.paused
        return self._status(MOVES[Operation.pause].done, pause=PauseInterval(paused_at=self.pause_started))

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
        return self._status(MOVES[Operation.switch].done, pause=pause)

    def do_arm(self, request: ArmRequest) -> ReconfigStatus:
        """The engine-agreed commit with no serving loop: every member is taken as armed at once, so
        the window (pause, switch, resume) lies inside this call, with no coordinator exchange in it."""
        self._require(request.job_id)
        self.pause_started = time.time()
        self.pause_started_mono = time.monotonic()
        return self.do_switch(JobRef(job_id=request.job_id))

    def heartbeat_body(self) -> bytes:
        """`AgentHeartbeat` as JSON, built by hand: the agents' own CPU must stay small beside the
        coordinator's on a shared machine (the fields are the protocol's; the coordinator validates)."""
        return json.dumps(
            {
                "state": self.state.value,
                "generation": self.generation,
                "rank": self.rank,
                "world_size": self.world_size if self.rank is not None else 0,
                "serving_steps": 0,
                "group_steps": 0,
                "key_check": self.key_check,
            }
        ).encode()

    def do_resume(self, ref: JobRef) -> ReconfigStatus:
        self._require(ref.job_id)
        pause = self._end_pause()
        if self.state == AgentState.paused:
            self.state = AgentState.serving
        return self._status(MOVES[Operation.resume].done, pause=pause)

    def do_abort(self, ref: JobRef) -> ReconfigStatus:
        self._require(ref.job_id)
        pause = self._end_pause()
        if self.state == AgentState.paused:
            self.state = AgentState.serving
        return self._status(MOVES[Operation.abort].done, pause=pause)


def _round_robin(num_logical: int, world: int) -> list[list[int]]:
    per_rank = (num_logical + world - 1) // world
    return [[(r * per_rank + s) % num_logical for s in range(per_rank)] for r in range(world)]


class Refused(Exception):
    """A call that does not fit the agent's job: 409 problem+json, as a real agent answers."""


def _json(model: BaseModel | dict[str, Any], status: int = 200, long_poll: bool = False) -> web.Response:
    body = model.model_dump_json() if isinstance(model, BaseModel) else json.dumps(model)
    headers = {LONG_POLL_HEADER: f"{MAX_WAIT_S:g}"} if long_poll else None
    return web.Response(body=body.encode(), status=status, content_type="application/json", headers=headers)


def key_gate(key: str) -> Any:
    """Every route but `/healthz` needs `Authorization: Bearer <the agent key>`, compared as the real
    agent does (`engine_agent.auth`: SHA-256 digests, `hmac.compare_digest`)."""
    import hashlib
    import hmac

    digest = hashlib.sha256(key.encode()).digest()

    @web.middleware
    async def gate(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != ROUTES["health"]:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            offered = hashlib.sha256(given.encode()).digest()
            if scheme.lower() != "bearer" or not hmac.compare_digest(offered, digest):
                return _json({"status": 401, "code": "invalid-agent-key", "detail": "agent key"}, 401)
        response: web.StreamResponse = await handler(request)
        return response

    return gate


def make_app(agent: LightAgent, key: str = "") -> web.Application:
    """The agent's routes on aiohttp.web: far cheaper per request than FastAPI, so that many agents on
    few cores measure the coordinator's fan-out rather than their own servers. With `key` (the
    environment's `EPCTL_AGENT_KEY`), every control call needs it, as on a real agent."""

    async def step(
        request: web.Request, model: type[ModelT], do: Callable[[ModelT], ReconfigStatus]
    ) -> web.Response:
        try:
            body = model.model_validate_json(await request.read())
        except ValidationError as exc:
            return _json({"type": "about:blank", "status": 422, "detail": str(exc)}, 422)
        try:
            status = do(body)
        except Refused as exc:
            return _json({"status": 409, "code": "wrong-job", "detail": str(exc)}, 409)
        # Every phase here completes at once, so a bounded long-poll (`wait_s`, `until`) is always
        # answered at once: say so, as a real agent does, so the coordinator uses its long-poll path.
        return _json(status, 202, long_poll=True)

    def route(model: type[ModelT], do: Callable[[ModelT], ReconfigStatus]) -> Handler:
        async def handle(request: web.Request) -> web.Response:
            return await step(request, model, do)

        return handle

    async def health(request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def info(request: web.Request) -> web.Response:
        return _json(agent.info())

    async def reconfig(request: web.Request) -> web.Response:
        if agent.reconfig is None:
            return _json({"status": 404, "code": "no-job", "detail": "no reconfiguration"}, 404, True)
        return _json(agent.reconfig, long_poll=True)

    async def cleanup(request: web.Request) -> web.Response:
        return _json(CleanupStatus(state=CleanupState.idle))

    async def infer(request: web.Request) -> web.Response:
        raw = await request.read()
        if raw[:4] == tensor_wire.MAGIC:  # the coordinator's canary (a job's probe, an incident's): echoed
            return web.Response(body=raw, content_type=tensor_wire.MEDIA_TYPE)
        body = InferRequest.model_validate_json(raw)
        return _json(
            InferResponse(outputs=body.tokens, generation=agent.generation, rank=agent.rank or 0, step=0)
        )

    app = web.Application(middlewares=[key_gate(key)] if key else [])
    app.router.add_get(ROUTES["health"], health)
    app.router.add_get(ROUTES["info"], info)
    app.router.add_get(ROUTES["reconfig"], reconfig)
    app.router.add_post(Operation.prepare.path, route(PrepareRequest, agent.do_prepare))
    app.router.add_post(Operation.sync.path, route(JobRef, agent.do_sync))
    app.router.add_post(Operation.pause.path, route(PauseRequest, agent.do_pause))
    app.router.add_post(Operation.switch.path, route(JobRef, agent.do_switch))
    app.router.add_post(Operation.arm.path, route(ArmRequest, agent.do_arm))
    app.router.add_post(Operation.resume.path, route(JobRef, agent.do_resume))
    app.router.add_post(Operation.abort.path, route(JobRef, agent.do_abort))
    app.router.add_get(ROUTES["cleanup"], cleanup)
    app.router.add_post(ROUTES["cleanup_retry"], cleanup)
    app.router.add_post(ROUTES["cleanup_acknowledge"], cleanup)
    app.router.add_post(ROUTES["infer"], infer)
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
    listing: list[dict[str, Any]] = []
    agents: list[LightAgent] = []
    runners: list[web.AppRunner] = []
    for index in range(args.count):
        engine_id = f"{args.prefix}{args.first_index + index}"
        # Engines with a global index below --serving form the current generation.
        global_index = args.first_index + index
        rank = global_index if global_index < args.serving else None
        agent = LightAgent(engine_id, "", args.generation if rank is not None else 0, rank, args.serving)
        agents.append(agent)
        # The keep-alive outlasts the coordinator's idle-connection expiry (`app.agents.transport`), as a
        # real agent's does: a connection the coordinator reuses is never one being closed here.
        runner = web.AppRunner(
            make_app(agent, os.environ.get("EPCTL_AGENT_KEY", "")),
            access_log=None,
            handle_signals=False,
            keepalive_timeout=args.keep_alive_s,
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        agent.url = f"http://127.0.0.1:{port}"
        listing.append({"engine_id": agent.engine_id, "url": agent.url, "port": port})
    if args.register:
        for agent in agents:
            await _register(args.register, args.token, args.deployment, agent)
    Path(args.ready_file).write_text(json.dumps(listing))
    await asyncio.Event().wait()  # serve until killed


class Beats:
    """One process's heartbeats: what was sent, answered, refused, and each round trip (the time from
    sending to the coordinator's answer, which it gives once the heartbeat is committed: the lag from a
    heartbeat to its record)."""

    def __init__(self) -> None:
        self.sent = self.ok = self.failed = self.reregistered = self.shed = 0
        self.rtt_ms: list[float] = []
        self.shed_ms: list[float] = []  # the round trips of the heartbeats shed (503 + Retry-After)
        self.last_ok: dict[str, float] = {}  # engine_id -> epoch seconds of its last answered heartbeat
        self.last_heard: dict[str, float] = {}  # ... of its last heartbeat answered 200 or shed
        # `POST /pause` (fleet.py's idle phase): no heartbeat is sent while `paused` is set.
        self.paused = asyncio.Event()
        self.resumed = asyncio.Event()

    def snapshot(self, reset: bool) -> dict[str, Any]:
        out = {
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "reregistered": self.reregistered,
            "shed": self.shed,
            "rtt_ms": self.rtt_ms,
            "shed_ms": self.shed_ms,
            "last_ok": self.last_ok,
            "last_heard": self.last_heard,
        }
        if reset:
            self.sent = self.ok = self.failed = self.reregistered = self.shed = 0
            self.rtt_ms = []
            self.shed_ms = []
        return out


async def _beat(
    session: Any, coordinator: str, agent: LightAgent, deployment: str, interval_s: float, beats: Beats
) -> None:
    """Heartbeat every `interval_s` from a random offset (a fleet's agents start at different moments),
    registering again on a 404 as the real agent does."""
    import random

    await asyncio.sleep(random.uniform(0, interval_s))
    url = f"{coordinator}/v1/engines/{agent.engine_id}/heartbeat"
    headers = {"Content-Type": "application/json"}
    next_at = time.monotonic()
    while True:
        next_at += interval_s
        if beats.paused.is_set():  # `POST /pause`: silent until resumed, then at once (staggered)
            await beats.resumed.wait()
            await asyncio.sleep(random.uniform(0, 1.0))
            next_at = time.monotonic() + interval_s
        started = time.perf_counter()
        beats.sent += 1
        try:
            async with session.post(url, data=agent.heartbeat_body(), headers=headers) as response:
                await response.read()
                if response.status == 404:
                    beats.reregistered += 1
                    await _register_with(session, coordinator, deployment, agent)
                elif response.status == 200:
                    beats.ok += 1
                    beats.rtt_ms.append((time.perf_counter() - started) * 1000.0)
                    beats.last_ok[agent.engine_id] = beats.last_heard[agent.engine_id] = time.time()
                elif (
                    wait := shed_retry_after_s(response.status, response.headers.get("Retry-After"))
                ) is not None:
                    # Shed by a saturated coordinator: heard, not recorded; the next one after Retry-After,
                    # as the real agent does (`engine_agent.coordinators.next_heartbeat_s`).
                    beats.shed += 1
                    beats.shed_ms.append((time.perf_counter() - started) * 1000.0)
                    beats.last_heard[agent.engine_id] = time.time()
                    next_at = max(next_at, time.monotonic() + next_heartbeat_s(interval_s, wait))
                else:
                    beats.failed += 1
        except Exception:  # any failure is a lost beat
            beats.failed += 1
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def _register_with(session: Any, coordinator: str, deployment: str, agent: LightAgent) -> None:
    body = AgentRegistration(
        engine_id=agent.engine_id,
        deployment=deployment,
        url=agent.url,
        platform=Platform.cpu,
        device="cpu",
        engine=agent.engine,
        generation=agent.generation,
        rank=agent.rank,
        pid=os.getpid(),
    )
    async with session.post(
        f"{coordinator}/v1/engines",
        data=body.model_dump_json(),
        headers={"Content-Type": "application/json"},
    ) as response:
        if response.status >= 300:
            raise RuntimeError(f"register {agent.engine_id}: {response.status} {await response.text()}")


async def serve_fleet(args: argparse.Namespace) -> None:
    """Agents of several deployments (`--fleet FILE`: [{engine_id, deployment, rank, world, generation}])
    that register, heartbeat every `--heartbeat-s`, and obey a control server: `GET /stats[?reset=1]`
    (the heartbeats), `POST /kill` {"engine_ids": [...]} (stop serving and heartbeating: a lost engine),
    `POST /pause` {"paused": true|false} (every agent's heartbeats stop; resumed, each beats within 1 s)."""
    import aiohttp

    spec = json.loads(Path(args.fleet).read_text())
    beats = Beats()
    agents: dict[str, tuple[LightAgent, web.AppRunner, str]] = {}
    listing: list[dict[str, Any]] = []
    for entry in spec:
        rank = entry.get("rank")
        agent = LightAgent(entry["engine_id"], "", entry.get("generation", 1), rank, entry.get("world", 0))
        agent.key_check = entry.get("key_check")
        runner = web.AppRunner(
            make_app(agent), access_log=None, handle_signals=False, keepalive_timeout=args.keep_alive_s
        )
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        agent.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        agents[agent.engine_id] = (agent, runner, entry["deployment"])
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    connector = aiohttp.TCPConnector(limit=args.connections)
    session = aiohttp.ClientSession(
        connector=connector, headers=headers, timeout=aiohttp.ClientTimeout(total=10.0)
    )
    gate = asyncio.Semaphore(8)
    tasks: dict[str, asyncio.Task[None]] = {}

    async def register(agent: LightAgent, deployment: str) -> None:
        async with gate:
            await _register_with(session, args.register, deployment, agent)
        # Heartbeating from its registration on, as the real agent does: not once the process's last
        # engine registered (on a loaded machine that took longer than the heartbeat timeout, and the
        # first engines registered were written off before they ever heartbeated).
        beat = _beat(session, args.register, agent, deployment, args.heartbeat_s, beats)
        tasks[agent.engine_id] = asyncio.create_task(beat)

    await asyncio.gather(*(register(a, d) for a, _, d in agents.values()))
    killed: dict[str, float] = {}

    async def stats(request: web.Request) -> web.Response:
        return _json(beats.snapshot(reset=request.query.get("reset") == "1") | {"killed": killed})

    async def kill(request: web.Request) -> web.Response:
        for engine_id in (await request.json())["engine_ids"]:
            if engine_id in tasks and engine_id not in killed:
                tasks[engine_id].cancel()
                await agents[engine_id][1].cleanup()
                killed[engine_id] = time.time()
        return _json({"killed": killed})

    async def pause(request: web.Request) -> web.Response:
        if (await request.json())["paused"]:
            beats.resumed.clear()
            beats.paused.set()
        else:
            beats.paused.clear()
            beats.resumed.set()
        return _json({"paused": beats.paused.is_set()})

    control = web.Application()
    control.router.add_get("/stats", stats)
    control.router.add_post("/kill", kill)
    control.router.add_post("/pause", pause)
    control_runner = web.AppRunner(control, access_log=None, handle_signals=False)
    await control_runner.setup()
    await web.TCPSite(control_runner, "127.0.0.1", 0).start()
    control_url = f"http://127.0.0.1:{control_runner.addresses[0][1]}"
    for agent, _, deployment in agents.values():
        listing.append(
            {"engine_id": agent.engine_id, "url": agent.url, "deployment": deployment, "control": control_url}
        )
    partial = Path(args.ready_file + ".partial")  # written whole, through a rename: a reader never sees half
    partial.write_text(json.dumps(listing))
    partial.rename(args.ready_file)
    await asyncio.Event().wait()  # serve until killed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1, help="agents (HTTP servers) in this process")
    parser.add_argument("--first-index", type=int, default=0, help="engine index of the first agent")
    parser.add_argument("--serving", type=int, default=0, help="engines with index < this serve generation")
    parser.add_argument("--generation", type=int, default=1)
    parser.add_argument("--prefix", default="light-")
    parser.add_argument("--keep-alive-s", type=float, default=75.0, help="idle connections kept (s)")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--register", default="", help="coordinator URL to register with (POST /v1/engines)")
    parser.add_argument("--token", default="")
    parser.add_argument("--deployment", default="bench")
    parser.add_argument("--fleet", default="", help="JSON file of agents in several deployments (fleet.py)")
    parser.add_argument("--heartbeat-s", type=float, default=3.0, help="with --fleet: heartbeat interval")
    parser.add_argument("--connections", type=int, default=64, help="with --fleet: heartbeat connections")
    args = parser.parse_args()
    asyncio.run(serve_fleet(args) if args.fleet else serve(args))


if __name__ == "__main__":
    main()
