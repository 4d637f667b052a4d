"""Where one binary `/v1/infer` spends its time: one world-1 agent (as `gpu.py` starts it), per-request
timestamps inside the agent, and two clients (httpx, as gpu.py uses, and a raw socket) to tell the
client's share from the agent's.

    .venv/bin/python benchmarks/infer_path.py                     # CUDA if present, else CPU (gloo)
    .venv/bin/python benchmarks/infer_path.py --json              # JSON requests interleaved, as gpu.py
    .venv/bin/python benchmarks/infer_path.py --experts 64 --intermediate 1408 --top-k 6   # gpu.py's model

The agent runs under this file's `--as-agent` wrapper: `epctl-agent` with hooks that stamp each infer
request (time.perf_counter, CLOCK_MONOTONIC, so comparable with the client's) at the ASGI call, body
read, submit, the engine step's start and end, the result's arrival, and the response's two sends, and
print one `TRACE` line per request to the agent's log. The wrapper changes no behaviour; it is not the
product. Stages (ms): client->app (request line and headers reach the app), body read, submit, queue
wait (submit to the step picking the request up: the idle wait), step, result hand-off (serving thread
to event loop), response build, response send, and the client's read of the answer.

The anchor, run side by side with the same two clients: a bare uvicorn server (`--as-anchor`, this
file) whose one ASGI callable reads the raw body and answers it back, no framework, no tensor, no
compute. What the agent's request costs beyond its step (total minus step, per request) is held to
1.5x the anchor's whole request. With `--cuda-graphs off on` one agent runs per value, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import PYTHON, ProcessGroup, Report, scratch_dir, summarize, wait_ready_file

TRACE_PREFIX = "TRACE "
PROBE_HEADER = "x-probe-id"
STAGES = [  # (name, from mark, to mark); "client_start"/"client_end" come from the client
    ("client->app", "client_start", "asgi_call"),
    ("body read", "asgi_call", "body_read"),
    ("submit", "body_read", "submitted"),
    ("queue wait", "submitted", "step_start"),
    ("step", "step_start", "step_end"),
    ("result hand-off + to bytes", "future_done", "route_resumed"),
    ("response build", "route_resumed", "response_start"),
    ("response send", "response_start", "response_sent"),
    ("client read", "response_sent", "client_end"),
]


# ---------------------------------------------------------------------------------------------------
# the agent side: hooks around the infer path


# The agent key of the agent this benchmark starts (EPCTL_AGENT_KEY), sent on every call to it.
AGENT_KEY = "epak_bench_" + secrets.token_urlsafe(24)


def run_traced_agent(argv: list[str]) -> int:
    import engine_agent.api as api
    import engine_agent.main as agent_main
    from engine_agent import engine
    from engine_agent.routes import infer as route

    marks: dict[str, float] = {}

    def mark(key: str) -> None:
        marks.setdefault(key, time.perf_counter())

    original_read = route.read_body

    async def read_body(request: Any, limit: int) -> bytearray:
        body = await original_read(request, limit)
        mark("body_read")
        return body

    original_submit = engine.ReferenceEngine.submit

    def submit(self: Any, tokens: Any) -> Any:
        future = original_submit(self, tokens)
        mark("submitted")
        future.add_done_callback(lambda _: mark("future_done"))
        return future

    original_iteration = engine.ReferenceEngine._iteration

    def iteration(self: Any, active: Any, layers: Any, batch: Any, *args: Any, **kwargs: Any) -> bool:
        if batch:
            mark("step_start")
        served = bool(original_iteration(self, active, layers, batch, *args, **kwargs))
        if batch:
            mark("step_end")
        return served

    original_encode = route.tensor_wire.encode

    def encode(dtype: str, shape: tuple[int, ...], data: bytes | memoryview) -> bytes:
        mark("route_resumed")  # the route runs again (result on the event loop, outputs as bytes)
        return original_encode(dtype, shape, data)

    route.read_body = read_body  # type: ignore[assignment]
    route.tensor_wire.encode = encode  # type: ignore[assignment]
    engine.ReferenceEngine.submit = submit  # type: ignore[method-assign]
    engine.ReferenceEngine._iteration = iteration  # type: ignore[method-assign]
    original_create = api.create_app

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = original_create(*args, **kwargs)
        build = app.build_middleware_stack

        def traced_stack() -> Any:
            stack = build()

            async def traced(scope: Any, receive: Any, send: Any) -> None:
                if scope["type"] != "http" or scope["path"] != "/v1/infer":
                    await stack(scope, receive, send)
                    return
                marks.clear()
                mark("asgi_call")

                async def traced_send(message: Any) -> None:
                    if message["type"] == "http.response.start":
                        mark("response_start")
                    await send(message)
                    if message["type"] == "http.response.body" and not message.get("more_body"):
                        mark("response_sent")

                await stack(scope, receive, traced_send)
                probe = dict(scope["headers"]).get(PROBE_HEADER.encode(), b"-").decode()
                stamps = " ".join(f"{k}={v:.6f}" for k, v in marks.items())
                print(f"{TRACE_PREFIX}{probe} {stamps}", file=sys.stderr, flush=True)

            return traced

        app.build_middleware_stack = traced_stack  # type: ignore[method-assign]
        return app

    agent_main.create_app = create_app  # type: ignore[assignment]
    return int(agent_main.main(argv) or 0)


# ---------------------------------------------------------------------------------------------------
# the anchor: bare uvicorn, raw bytes in and out


def run_anchor(argv: list[str]) -> int:
    """`--as-anchor --ready-file F`: serve the echo app on a free loopback port, the agent's way (a
    TCP socket bound first, so uvicorn's accepted connections get TCP_NODELAY; no access log)."""
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args(argv)

    async def echo(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        headers = [
            (b"content-type", b"application/octet-stream"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(echo, log_level="warning", access_log=False, lifespan="on"))

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.01)
        Path(args.ready_file).write_text(f"http://127.0.0.1:{sock.getsockname()[1]}\n")

    async def serve() -> None:
        task = asyncio.create_task(announce())
        await server.serve(sockets=[sock])
        await task

    asyncio.run(serve())
    return 0


# ---------------------------------------------------------------------------------------------------
# the clients


def raw_post(host: str, port: int, body: bytes, probe: str) -> tuple[float, float]:
    """One request on a fresh socket (TCP_NODELAY, one write); (start, end) perf_counter stamps."""
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = (
        f"POST /v1/infer HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/octet-stream\r\n"
        f"{PROBE_HEADER}: {probe}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    sock.sendall(head + body)
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(1 << 20)
    end_of_head = buffer.index(b"\r\n\r\n") + 4
    lines = buffer[:end_of_head].decode().split("\r\n")
    length = int(next(line for line in lines if line.lower().startswith("content-length")).split(":")[1])
    while len(buffer) - end_of_head < length:
        buffer += sock.recv(1 << 20)
    end = time.perf_counter()
    sock.close()
    if not lines[0].split()[1] == "200":
        raise RuntimeError(f"raw infer answered {lines[0]}")
    return start, end


async def drive(url: str, args: argparse.Namespace) -> dict[str, tuple[str, float, float]]:
    """probe id -> (client, start, end)."""
    import httpx
    import torch

    from engine_agent import tensor_wire

    batch = torch.randn(args.tokens, args.hidden)
    tokens = batch.tolist()
    body = tensor_wire.encode("float32", tuple(batch.shape), batch.numpy().tobytes())
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    stamps: dict[str, tuple[str, float, float]] = {}
    async with httpx.AsyncClient(timeout=60.0) as http:
        for i in range(args.requests):
            if args.json:  # as gpu.py: a JSON request before each binary one, on the same connection
                (await http.post(f"{url}/v1/infer", json={"tokens": tokens})).raise_for_status()
            probe = f"httpx-{i}"
            headers = {"content-type": tensor_wire.MEDIA_TYPE, PROBE_HEADER: probe}
            start = time.perf_counter()
            response = await http.post(f"{url}/v1/infer", content=body, headers=headers)
            response.raise_for_status()
            stamps[probe] = ("httpx", start, time.perf_counter())
            probe = f"raw-{i}"
            start, end = await asyncio.to_thread(raw_post, host, int(port), body, probe)
            stamps[probe] = ("raw socket", start, end)
    return stamps


def read_traces(log: Path) -> dict[str, dict[str, float]]:
    traces = {}
    for line in log.read_text().splitlines():
        if line.startswith(TRACE_PREFIX):
            probe, *pairs = line[len(TRACE_PREFIX) :].split()
            traces[probe] = {k: float(v) for k, v in (pair.split("=", 1) for pair in pairs)}
    return traces


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=8, help="small: the step, not the path, is cheap")
    parser.add_argument("--top-k", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--json", action="store_true", help="a JSON request before each binary one")
    parser.add_argument(
        "--grouped-step", choices=["auto", "on", "off"], default="auto", help="the agent's --grouped-step"
    )
    parser.add_argument(
        "--cuda-graphs", nargs="+", choices=["off", "on", "auto"], default=None,
        help="the agent's --cuda-graphs, one agent per value (default: off on on a GPU, off on CPU)",
    )  # fmt: skip
    parser.add_argument("--name", help="results file name (default infer_path, or infer_path-cpu)")
    args = parser.parse_args(argv)

    import torch

    on_gpu = torch.cuda.is_available()
    platform, device = ("cuda", "cuda:0") if on_gpu else ("cpu", "cpu")
    modes = args.cuda_graphs or (["off", "on"] if on_gpu else ["off"])
    report = Report(args.name or ("infer_path" if on_gpu else "infer_path-cpu"))
    report.parameters = vars(args) | {"platform": platform, "device": device, "cuda_graphs": modes}
    anchor = measure_anchor(args)
    report.results["anchor_ms"] = anchor
    by_mode = {mode: measure_agent(args, platform, device, on_gpu, mode) for mode in modes}
    report.results["stages_ms"] = by_mode
    clients = ("httpx", "raw socket")
    for mode, summaries in by_mode.items():
        rows = []
        for name in ["total", "total - step", *(s[0] for s in STAGES)]:
            row: list[Any] = [name]
            for client in clients:
                summary = summaries.get(client, {}).get(name, {})
                row += [summary.get("p50"), summary.get("max")]
            rows.append(row)
        anchor_row: list[Any] = ["bare uvicorn anchor: total"]
        for client in clients:
            anchor_row += [anchor[client].get("p50"), anchor[client].get("max")]
        rows.append(anchor_row)
        report.add_table(
            f"Binary /v1/infer of {args.tokens} x {args.hidden} on one {platform} agent, graphs {mode} (ms)",
            ["stage", "httpx p50", "httpx max", "raw socket p50", "raw socket max"],
            rows,
        )
    last = by_mode[modes[-1]]
    for client in clients:
        beyond = last.get(client, {}).get("total - step", {}).get("p50")
        if beyond is not None and anchor[client].get("p50"):
            report.target(
                f"/v1/infer beyond its step / bare uvicorn raw-bytes request, {client} (graphs {modes[-1]})",
                beyond / anchor[client]["p50"],
                1.5,
                "x",
            )
    total = last.get("httpx", {}).get("total", {}).get("p50")
    if on_gpu and total is not None:
        report.target(
            f"/v1/infer of {args.tokens} tokens, binary body, p50 (graphs {modes[-1]})", total, 3.0, "ms"
        )
    report.targets_table()
    report.write()


def measure_anchor(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The bare uvicorn echo server, driven by the same two clients with the same body."""
    scratch = scratch_dir("infer_path-anchor")
    ready = scratch / "anchor.ready"
    ready.unlink(missing_ok=True)
    with ProcessGroup(scratch) as group:
        anchor = group.start(
            "anchor", [PYTHON, str(Path(__file__).resolve()), "--as-anchor", "--ready-file", str(ready)]
        )
        url = wait_ready_file(ready, anchor, timeout_s=60)
        stamps = asyncio.run(drive(url, args))
    per_client: dict[str, list[float]] = {}
    for client, start, end in stamps.values():
        per_client.setdefault(client, []).append((end - start) * 1000)
    return {client: summarize(values) for client, values in per_client.items()}


def measure_agent(
    args: argparse.Namespace, platform: str, device: str, on_gpu: bool, mode: str
) -> dict[str, dict[str, Any]]:
    """One traced agent with `--cuda-graphs mode`: per client, each stage's summary."""
    import gpu  # its reconfigure() forms generation 1

    scratch = scratch_dir(f"infer_path-{mode}")
    ready = scratch / "agent.ready"
    ready.unlink(missing_ok=True)
    with ProcessGroup(scratch) as group:
        argv_agent = [
            PYTHON, str(Path(__file__).resolve()), "--as-agent", "--port", "0", "--ready-file", str(ready),
            "--engine-id", "infer-path-0", "--platform", platform, *(["--device", device] if on_gpu else []),
            "--num-logical-experts", str(args.experts), "--hidden-size", str(args.hidden),
            "--intermediate-size", str(args.intermediate), "--top-k", str(args.top_k), "--dtype", args.dtype,
            "--grouped-step", args.grouped_step, "--cuda-graphs", mode,
        ]  # fmt: skip
        agent = group.start("agent", argv_agent, env={"EPCTL_AGENT_KEY": AGENT_KEY})
        url = wait_ready_file(ready, agent, timeout_s=300)

        async def run() -> dict[str, tuple[str, float, float]]:
            from app.agents.client import AgentClient

            async with AgentClient("infer-path-0", url, timeout_s=60.0, keys=(AGENT_KEY,)) as client:
                info = await client.info()
                await gpu.reconfigure(
                    client, info, generation=1, old=False, strategy="background", policy="eager",
                    backend="gloo",
                )  # fmt: skip
            return await drive(url, args)

        stamps = asyncio.run(run())
    traces = read_traces(scratch / "agent.log")
    per_client: dict[str, dict[str, list[float]]] = {}
    for probe, (client, start, end) in stamps.items():
        marks = traces.get(probe)
        if marks is None:
            continue
        marks = marks | {"client_start": start, "client_end": end}
        stages = per_client.setdefault(client, {"total": [], "total - step": []})
        stages["total"].append((end - start) * 1000)
        if "step_start" in marks and "step_end" in marks:
            step = marks["step_end"] - marks["step_start"]
            stages["total - step"].append((end - start - step) * 1000)
        for name, a, b in STAGES:
            if a in marks and b in marks:
                stages.setdefault(name, []).append((marks[b] - marks[a]) * 1000)
    return {c: {k: summarize(v) for k, v in s.items()} for c, s in per_client.items()}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--as-agent"]:
        sys.exit(run_traced_agent(sys.argv[2:]))
    if sys.argv[1:2] == ["--as-anchor"]:
        sys.exit(run_anchor(sys.argv[2:]))
    main()
