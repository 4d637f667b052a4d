"""A STAND-IN vLLM server for the elastic EP success path, which these machines cannot run for real
(vLLM's elastic EP needs GPUs and the Ray DP backend).

What is real: vLLM's own `/scale_elastic_ep` and `/is_scaling_elastic_ep` route code and its 503
`ScalingMiddleware`, imported from the installed vllm package (`vllm.entrypoints.serve.elastic_ep`),
with vLLM's own error handlers (its error body shape). What stands in:

- `StandInEngineClient`, in place of vLLM's `AsyncLLM`: `scale_elastic_ep(n, drain_timeout)` follows
  `AsyncLLM._scale_elastic_ep`'s contract (one change at a time under a lock, the same size is a
  no-op, the scaling flag set while the change runs) and takes a configurable time and outcome:
  `success`, `drain-timeout` (TimeoutError -> vLLM's 408), `error` (-> 500), `invalid` (ValueError ->
  400), `hang` (never returns), `stuck` (fails and leaves the scaling flag set, as a failed commit in
  AsyncLLM does), `wedge` (fails, then refuses every later scale, as vLLM issue 53947 describes);
- `conflict`: a newer vLLM's 409 "reconfiguration is already active", answered before vLLM's route;
- `/health`, `/metrics` (one `engine` label per engine, rebuilt at start and on scale-up only, as
  vLLM 0.32 does), `/v1/models`, `/v1/completions` (a fixed 1-token answer, no model);
- `/standin/*`: the test's controls, served outside vLLM's middleware.

Run with the vLLM venv: `.venv-vllm/bin/python tests/vllm/standin_server.py --port P`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from vllm.entrypoints.serve.elastic_ep import api_router as vllm_elastic_ep
from vllm.entrypoints.serve.elastic_ep.middleware import (
    ScalingMiddleware,
    get_scaling_elastic_ep,
    set_scaling_elastic_ep,
)

MODEL = "standin-model"


class StandInEngineClient:
    """Stands in for vLLM's AsyncLLM behind vLLM's own elastic EP route."""

    def __init__(self) -> None:
        self.dp_size = 1
        self.metrics_dp_size = 1  # vLLM rebuilds its per-engine series at start and on scale-up only
        self.outcome = "success"
        self.delay_s = 1.0
        self.wedged = False
        self.calls: list[dict[str, Any]] = []
        self.flag_windows: list[list[float | None]] = []  # [set_at, cleared_at] epoch s: the 503 windows
        self._lock = asyncio.Lock()
        self._running: asyncio.Task[None] | None = None

    async def scale_elastic_ep(self, new_data_parallel_size: int, drain_timeout: int = 300) -> None:
        self.calls.append({"new_data_parallel_size": new_data_parallel_size, "drain_timeout": drain_timeout})
        async with self._lock:
            if self.wedged:
                raise RuntimeError("reconfiguration is already active")
            if new_data_parallel_size == self.dp_size:
                return  # AsyncLLM: "Data parallel size is already N, skipping scale"
            if self.outcome == "invalid":
                raise ValueError(
                    f"Cannot scale to data_parallel_size {new_data_parallel_size} (stand-in limit)"
                )
            self._flag(True)
            self._running = asyncio.current_task()
            try:
                if self.outcome == "hang":
                    await asyncio.Event().wait()
                await asyncio.sleep(self.delay_s)
                if self.outcome == "drain-timeout":
                    raise TimeoutError(f"Timeout reached after {drain_timeout} seconds waiting for requests")
                if self.outcome in ("error", "stuck"):
                    raise RuntimeError("stand-in: the change failed")
                if self.outcome == "wedge":
                    self.wedged = True
                    raise RuntimeError("stand-in: the change failed and left the engine prepared")
                if new_data_parallel_size > self.dp_size:
                    self.metrics_dp_size = new_data_parallel_size
                self.dp_size = new_data_parallel_size
                self._flag(False)
            except BaseException:
                if self.outcome != "stuck":
                    self._flag(False)
                raise
            finally:
                self._running = None

    def _flag(self, on: bool) -> None:
        """vLLM's module-level scaling flag (its middleware's switch), with the time it changed."""
        set_scaling_elastic_ep(on)
        if on:
            self.flag_windows.append([time.time(), None])
        elif self.flag_windows and self.flag_windows[-1][1] is None:
            self.flag_windows[-1][1] = time.time()

    def reset(self) -> None:
        if self._running is not None:
            self._running.cancel()
        self._flag(False)
        self.wedged = False
        self.outcome = "success"
        self.calls.clear()
        self.flag_windows.clear()


def build_app() -> FastAPI:
    app = FastAPI()
    engine = StandInEngineClient()
    app.state.engine_client = engine
    app.state.args = argparse.Namespace(log_error_stack=False)  # read by vLLM's error handlers
    vllm_elastic_ep.attach_router(app)
    # vLLM's own handlers give its error body shape ({"error": {"message": ...}}).
    from vllm.entrypoints.serve.exception_handling.register import init_exception_handler

    init_exception_handler(app)

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        lines = [
            f'vllm:num_requests_running{{engine="{i}",model_name="{MODEL}"}} 0.0'
            for i in range(engine.metrics_dp_size)
        ]
        return PlainTextResponse("\n".join(["# TYPE vllm:num_requests_running gauge", *lines]) + "\n")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        await request.json()
        await asyncio.sleep(0.005)
        return {"object": "text_completion", "model": MODEL, "choices": [{"index": 0, "text": "~"}]}

    control = FastAPI()

    @control.post("/standin/configure")
    async def configure(request: Request) -> dict[str, Any]:
        body = await request.json()
        engine.outcome = body.get("outcome", engine.outcome)
        engine.delay_s = float(body.get("delay_s", engine.delay_s))
        if "dp_size" in body:
            engine.dp_size = int(body["dp_size"])
        if "metrics_dp_size" in body:
            engine.metrics_dp_size = int(body["metrics_dp_size"])
        return state()

    @control.post("/standin/reset")
    async def reset() -> dict[str, Any]:
        engine.reset()
        return state()

    @control.get("/standin/state")
    async def get_state() -> dict[str, Any]:
        return state()

    def state() -> dict[str, Any]:
        return {
            "dp_size": engine.dp_size,
            "metrics_dp_size": engine.metrics_dp_size,
            "outcome": engine.outcome,
            "scaling": get_scaling_elastic_ep(),
            "wedged": engine.wedged,
            "calls": engine.calls,
            "flag_windows": engine.flag_windows,
        }

    app.add_middleware(ScalingMiddleware)  # vLLM's: 503 on every route while scaling
    app.add_middleware(StandInFront, control=control, engine=engine)  # outermost
    return app


class StandInFront:
    """In front of vLLM's middleware: the test's controls, and a newer vLLM's 409 (`conflict`)."""

    def __init__(self, app: ASGIApp, control: ASGIApp, engine: StandInEngineClient) -> None:
        self.app = app
        self.control = control
        self.engine = engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith("/standin/"):
            await self.control(scope, receive, send)
            return
        if path == "/scale_elastic_ep" and self.engine.outcome == "conflict":
            body = b""
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            wanted = json.loads(body or b"{}").get("new_data_parallel_size")
            if wanted != self.engine.dp_size:
                self.engine.calls.append({"new_data_parallel_size": wanted, "answered": 409})
                error = {"message": "reconfiguration is already active", "type": "Conflict", "code": 409}
                await JSONResponse({"error": error}, status_code=409)(scope, receive, send)
                return

            async def replay() -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(), host="127.0.0.1", port=args.port, log_level="warning")
