"""A request whose client disconnected before its answer started stops where it is: waiting at the
admission gate, or inside its handler; and the gate's place passes on."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from app.core.limits import ABANDONED, Limits, Receive, RequestLimits, Send

Message = MutableMapping[str, Any]


def scope(path: str) -> dict[str, Any]:
    return {"type": "http", "path": path, "method": "GET", "headers": [], "query_string": b""}


def client(gone: asyncio.Event) -> Receive:
    """A server's `receive` for a GET: its (empty) body, then the disconnect once `gone` is set."""
    first = True

    async def receive() -> Message:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    return receive


def test_requests_whose_client_left_stop_waiting_and_stop_working() -> None:
    async def scenario() -> None:
        ran: list[str] = []
        sent: dict[str, list[Message]] = {}
        holding, release = asyncio.Event(), asyncio.Event()

        async def app(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
            ran.append(scope["path"])
            if scope["path"] == "/hold":
                holding.set()
                await release.wait()  # a handler's long step (a database slot, an agent call)
                ran.append("/hold finished")
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        def send_for(path: str) -> Send:
            messages = sent.setdefault(path, [])

            async def send(message: Message) -> None:
                messages.append(message)

            return send

        middleware = RequestLimits(app, Limits(max_active_requests=1))
        before = ABANDONED._value.get()
        holder_gone, waiter_gone = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(middleware(scope("/hold"), client(holder_gone), send_for("/hold")))
        await holding.wait()
        waiter = asyncio.create_task(middleware(scope("/waits"), client(waiter_gone), send_for("/waits")))
        while middleware.gate.waiting_count == 0:  # it queues behind the holder
            await asyncio.sleep(0)
        waiter_gone.set()
        await waiter
        assert "/waits" not in ran and sent.get("/waits", []) == []
        holder_gone.set()
        await holder
        assert "/hold finished" not in ran and sent["/hold"] == []
        assert ABANDONED._value.get() == before + 2
        # The gate's place was handed back: the next request runs and is answered.
        await middleware(scope("/after"), client(asyncio.Event()), send_for("/after"))
        assert "/after" in ran and sent["/after"][0]["status"] == 200

    asyncio.run(scenario())
