"""Heartbeat shedding (issue 37): past saturation the coordinator answers a heartbeat 503 with
Retry-After at once, remembers it heard the engine, and the agent waits the Retry-After. The rules are
pure (tables); the gate's part runs the real middleware with the queue's age set, not timed."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.core.limits import LEAVE_GATE, Limits, Receive, RequestLimits, Send
from app.core.shedding import (
    ShedHeartbeats,
    bearer_secret,
    heard_at,
    heartbeat_engine,
    retry_after_s,
    shed,
    shed_now,
)
from engine_agent.coordinators import next_heartbeat_s, shed_retry_after_s

Message = MutableMapping[str, Any]
T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("method", "path", "engine"),
    [
        ("POST", "/v1/engines/e-17/heartbeat", "e-17"),
        ("GET", "/v1/engines/e-17/heartbeat", None),
        ("POST", "/v1/engines/e-17", None),
        ("POST", "/v1/engines/a/b/heartbeat", None),
        ("POST", "/v1/engines//heartbeat", None),
        ("POST", "/v1/reconfigurations", None),
    ],
)
def test_which_requests_are_heartbeats(method: str, path: str, engine: str | None) -> None:
    assert heartbeat_engine(method, path) == engine


@pytest.mark.parametrize(
    ("waiting", "age_s", "after_s", "expected"),
    [
        (0, 0.0, 1.0, False),  # nobody waits: admitted
        (0, 5.0, 1.0, False),  # (an age without waiters cannot happen; admitted all the same)
        (10, 0.5, 1.0, False),  # a short queue: the heartbeat is answered within the bound
        (10, 1.0, 1.0, False),  # at the bound
        (1, 1.01, 1.0, True),  # past it: answered at once
        (500, 9.0, 1.0, True),
        (500, 9.0, 0.0, False),  # 0 turns shedding off
    ],
)
def test_when_a_heartbeat_is_shed(waiting: int, age_s: float, after_s: float, expected: bool) -> None:
    assert shed(waiting, age_s, after_s) is expected


@pytest.mark.parametrize(("timeout_s", "retry"), [(15.0, 5), (30.0, 10), (9.0, 3), (2.0, 1), (0.5, 1)])
def test_retry_after_leaves_two_more_heartbeats_inside_the_timeout(timeout_s: float, retry: int) -> None:
    assert retry_after_s(timeout_s) == retry


@pytest.mark.parametrize(
    ("recorded", "shed_at", "expected"),
    [
        (None, None, None),
        (T0, None, T0),
        (None, T0, T0),
        (T0, T0 + timedelta(seconds=5), T0 + timedelta(seconds=5)),
        (T0 + timedelta(seconds=5), T0, T0 + timedelta(seconds=5)),
        (T0.replace(tzinfo=None), T0 + timedelta(seconds=1), T0 + timedelta(seconds=1)),  # SQLite naive
    ],
)
def test_heard_is_the_later_of_the_recorded_and_the_shed_heartbeat(
    recorded: datetime | None, shed_at: datetime | None, expected: datetime | None
) -> None:
    assert heard_at(recorded, shed_at) == expected


@pytest.mark.parametrize(
    ("headers", "secret"),
    [
        ([(b"authorization", b"Bearer epctl_abc")], "epctl_abc"),
        ([(b"authorization", b"bearer  epctl_abc ")], "epctl_abc"),
        ([(b"authorization", b"Basic dXNlcg==")], None),
        ([(b"authorization", b"Bearer ")], None),
        ([], None),
    ],
)
def test_the_bearer_secret_of_a_request(headers: list[tuple[bytes, bytes]], secret: str | None) -> None:
    assert bearer_secret({"headers": headers}) == secret


def test_shed_heartbeats_are_remembered_until_pruned() -> None:
    heard = ShedHeartbeats()
    heard.record("a", T0)
    heard.record("b", T0 + timedelta(seconds=10))
    heard.record("a", T0 + timedelta(seconds=2))
    assert heard.snapshot() == {"a": T0 + timedelta(seconds=2), "b": T0 + timedelta(seconds=10)}
    assert heard.newest() == T0 + timedelta(seconds=10)
    heard.prune(T0 + timedelta(seconds=5))
    assert heard.snapshot() == {"b": T0 + timedelta(seconds=10)}
    heard.prune(T0 + timedelta(seconds=11))
    assert heard.newest() is None


@pytest.mark.parametrize(
    ("status", "header", "expected"),
    [
        (503, "5", 5.0),
        (503, " 2.5 ", 2.5),
        (503, None, None),  # a 503 without Retry-After: a failure, not a shed heartbeat
        (503, "Wed, 21 Oct 2026 07:28:00 GMT", None),
        (503, "-1", None),
        (200, "5", None),
        (429, "5", None),
    ],
)
def test_the_agent_reads_a_shed_answer(status: int, header: str | None, expected: float | None) -> None:
    assert shed_retry_after_s(status, header) == expected


@pytest.mark.parametrize(
    ("interval", "retry", "wait"), [(3.0, None, 3.0), (3.0, 5.0, 5.0), (10.0, 5.0, 10.0)]
)
def test_the_agent_stretches_its_interval_to_the_retry_after(
    interval: float, retry: float | None, wait: float
) -> None:
    assert next_heartbeat_s(interval, retry) == wait


# --- the gate ---------------------------------------------------------------------------------------------


def request(method: str, path: str) -> dict[str, Any]:
    headers = [(b"content-length", b"2"), (b"authorization", b"Bearer s")] if method == "POST" else []
    return {"type": "http", "path": path, "method": method, "headers": headers, "query_string": b""}


def body(payload: bytes) -> Receive:
    first = True
    forever = asyncio.Event()

    async def receive() -> Message:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": payload, "more_body": False}
        await forever.wait()
        return {"type": "http.disconnect"}

    return receive


def test_a_heartbeat_is_answered_at_once_while_the_queue_is_old_and_its_engine_heard() -> None:
    async def scenario() -> None:
        ran: list[str] = []
        release = asyncio.Event()
        shed_for: list[str] = []

        async def app(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
            ran.append(scope["path"])
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        answers: dict[str, list[Message]] = {}

        def sender(name: str) -> Send:
            async def send(message: Message) -> None:
                answers.setdefault(name, []).append(message)

            return send

        limits = Limits(max_active_requests=1, heartbeat_shed_after_s=1.0, heartbeat_retry_after_s=5)
        middleware = RequestLimits(app, limits, on_shed=lambda scope, engine: shed_for.append(engine))
        hb = "/v1/engines/e1/heartbeat"
        holder = asyncio.create_task(middleware(request("GET", "/hold"), body(b""), sender("hold")))
        waiter = asyncio.create_task(middleware(request("POST", hb), body(b"{}"), sender("young")))
        while middleware.gate.waiting_count < 1:
            await asyncio.sleep(0)
        # The queue is young: a heartbeat waits its turn like any request.
        assert shed_for == [] and "young" not in answers
        # The queue's head has waited 10 s (set, not waited for): the next heartbeat is shed at once...
        queued_at, turn = middleware.gate.waiting[0]
        middleware.gate.waiting[0] = (queued_at - 10.0, turn)
        shed_one = asyncio.create_task(
            middleware(request("POST", "/v1/engines/e2/heartbeat"), body(b"{}"), sender("shed"))
        )
        for _ in range(100):  # loop turns, not time: answered without waiting for a place
            if "shed" in answers:
                break
            await asyncio.sleep(0)
        if "shed" not in answers:  # it waits for a place like any request: release it, then fail
            release.set()
            await asyncio.gather(holder, waiter, shed_one)
        assert "shed" in answers and not release.is_set()
        start = answers["shed"][0]
        assert start["status"] == 503 and (b"retry-after", b"5") in start["headers"]
        assert (b"connection", b"close") not in start["headers"]  # the body was read: keep the connection
        assert b"heartbeat-shed" in answers["shed"][1]["body"]
        assert shed_for == ["e2"] and "/v1/engines/e2/heartbeat" not in ran
        # ... while any other request still waits its turn.
        other = asyncio.create_task(
            middleware(request("POST", "/v1/reconfigurations"), body(b"{}"), sender("job"))
        )
        for _ in range(100):
            if middleware.gate.waiting_count == 2:
                break
            await asyncio.sleep(0)
        assert "job" not in answers and middleware.gate.waiting_count == 2
        release.set()
        await asyncio.gather(holder, waiter, other, shed_one)
        assert answers["young"][0]["status"] == 200 and answers["job"][0]["status"] == 200
        assert ran == ["/hold", hb, "/v1/reconfigurations"]

    asyncio.run(scenario())


def test_a_shed_heartbeat_counts_while_its_token_was_found_valid_within_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The authentication cache keeps a token 2 s; under saturation nothing may look it up again, so a
    shed heartbeat asks whether it was found valid within the heartbeat timeout instead."""
    from app.api import deps
    from app.core.auth import Principal, TokenRole

    clock = [100.0]
    monkeypatch.setattr(deps.time, "monotonic", lambda: clock[0])
    cache = deps.PrincipalCache(ttl_s=2.0)
    agent = Principal(token_id="tok_1", name="agents", role=TokenRole.admin)
    cache.put("h", agent)
    clock[0] += 10.0
    assert cache.get("h") is None  # past the cache's own time
    assert cache.seen("h", within_s=15.0) == agent  # but found valid 10 s ago
    assert cache.seen("h", within_s=5.0) is None
    assert cache.seen("other", within_s=15.0) is None
    cache.clear()  # a revoke through this coordinator
    assert cache.seen("h", within_s=15.0) is None


@pytest.mark.parametrize(
    ("waiting", "age_s", "backlog_s", "after_s", "expected"),
    [
        (0, 0.0, 0.0, 1.0, False),  # nothing waits
        (0, 0.0, 0.5, 1.0, False),  # heartbeats wait for their commit, within the bound
        (0, 0.0, 1.5, 1.0, True),  # ... longer than the bound: the coordinator falls behind
        (10, 2.0, 0.0, 1.0, True),  # the gate's own queue is old (as `shed`)
        (0, 0.0, 9.0, 0.0, False),  # shedding off
    ],
)
def test_a_heartbeat_is_shed_when_the_gate_or_the_commit_backlog_is_old(
    waiting: int, age_s: float, backlog_s: float, after_s: float, expected: bool
) -> None:
    assert shed_now(waiting, age_s, backlog_s, after_s) is expected


def test_a_request_that_only_waits_leaves_the_gate_before_its_answer() -> None:
    """A heartbeat queued for its batch's commit holds nothing but a future: it leaves the gate
    (`LEAVE_GATE`), so the next request is admitted while it waits (before, the gate's places capped a
    batch at `max_active_requests` heartbeats: 16)."""

    async def scenario() -> None:
        release = asyncio.Event()
        ran: list[str] = []

        async def app(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
            ran.append(scope["path"])
            if scope["path"].endswith("/heartbeat"):
                scope[LEAVE_GATE]()  # queued: from here on it only waits
                await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        async def ignore(message: Message) -> None:
            del message

        middleware = RequestLimits(app, Limits(max_active_requests=1))
        heartbeat = request("POST", "/v1/engines/e1/heartbeat")
        first = asyncio.create_task(middleware(heartbeat, body(b"{}"), ignore))
        second = asyncio.create_task(middleware(request("GET", "/v1/engines"), body(b""), ignore))
        for _ in range(100):  # loop turns, not time
            if second.done():
                break
            await asyncio.sleep(0)
        done = second.done()
        release.set()
        await asyncio.gather(first, second)
        assert done and ran == ["/v1/engines/e1/heartbeat", "/v1/engines"]
        assert middleware.gate.active == 0  # left once, not twice

    asyncio.run(scenario())


def test_a_heartbeat_is_shed_while_admitted_heartbeats_wait_too_long_for_their_commit() -> None:
    async def scenario() -> None:
        answers: dict[str, int] = {}

        async def app(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        def sender(name: str) -> Send:
            async def send(message: Message) -> None:
                if message["type"] == "http.response.start":
                    answers[name] = message["status"]

            return send

        limits = Limits(heartbeat_shed_after_s=1.0)
        middleware = RequestLimits(app, limits, backlog_age_s=lambda: 3.0)  # the oldest waits 3 s
        await middleware(request("POST", "/v1/engines/e1/heartbeat"), body(b"{}"), sender("hb"))
        await middleware(request("GET", "/v1/engines"), body(b""), sender("read"))
        assert answers == {"hb": 503, "read": 200}  # nobody waits at the gate: shed for the backlog alone

    asyncio.run(scenario())
