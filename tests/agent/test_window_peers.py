"""A peer frozen inside the commit window (`engine_agent.reconfig.window_peers`, issue 34), in-process:
a window collective that runs slow asks the other participants' `/healthz`; one that does not answer (a
socket the kernel accepts and nobody serves: a frozen agent) gives the window's group up and is named;
the way back leaves an old generation whose member did not answer instead of resuming it. The process
boundary is tests/e2e/test_faults_in_jobs.py (the frozen staying engine in the window)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from engine_agent.groups import SLOW_AFTER_S, CommGroup
from engine_agent.protocol import ReconfigPhase, ReconfigStatus, Role, Strategy, WarmupPolicy
from engine_agent.reconfig.errors import ReconfigError
from engine_agent.reconfig.job import Job
from engine_agent.reconfig.steps import steps_for
from engine_agent.reconfig.window_peers import (
    GIVEN_UP_KEY,
    WINDOW_SLOW_AFTER_S,
    refuse_if_given_up,
    resume_or_leave,
    unwatch,
    watch,
)
from tests.agent.test_reconfig_tables import request
from tests.support.waiting import wait_until


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def live_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture
def frozen_url() -> Iterator[str]:
    """Connections are accepted by the kernel (the backlog) and never answered: a SIGSTOPped agent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def window_job(urls: dict[str, str]) -> Job:
    """Engine `a` of a 3 -> 2 job: `a` and `b` stay, `c` leaves."""
    req = request(["a", "b"], ["a", "b", "c"])
    for member in [*req.members, *req.old_members]:
        member.url = urls.get(member.engine_id, member.url)
    plan = steps_for(Role.staying, Strategy.background, WarmupPolicy.deferred)
    status = ReconfigStatus(
        job_id="job-1",
        generation=2,
        role=Role.staying,
        phase=ReconfigPhase.armed,
        steps_total=len(plan.prepare),
        warmup_policy=WarmupPolicy.deferred,
        strategy=Strategy.background,
        updated_at=time.time(),
    )
    return Job(me="a", request=req, role=Role.staying, policy=WarmupPolicy.deferred, plan=plan, status=status,
               counted=plan.window)  # fmt: skip


def probes_done() -> None:
    """Until the peer check's thread has reported (its probes end at their 1 s deadline)."""
    wait_until(
        lambda: not any(t.name == "peer-check" for t in threading.enumerate()), timeout_s=30, what="the probe"
    )


def new_group() -> CommGroup:
    return CommGroup("ep", 2, None, rank=0, size=2, device=torch.device("cpu"), timeout_s=300.0)


def test_a_peer_that_does_not_answer_inside_the_window_gives_the_group_up_and_is_named(
    live_url: str, frozen_url: str
) -> None:
    job, group = window_job({"b": frozen_url, "c": live_url}), new_group()
    named: list[tuple[int, list[str]]] = []
    watch(job, group, lambda generation, ids: named.append((generation, ids)))
    assert group.on_slow is not None and group.slow_after_s == WINDOW_SLOW_AFTER_S  # asked early
    group.on_slow()  # the warm-up's collective waited longer than a step could
    wait_until(group.abandoned.is_set, timeout_s=30, what="the window's group given up")
    assert job.unresponsive == ["b"]
    assert named == [(1, ["b"])]  # the old generation's member, for the agent's report of its break
    assert "b" in group.abandon_reason


def test_every_peer_answering_leaves_the_window_alone(live_url: str) -> None:
    job, group = window_job({"b": live_url, "c": live_url}), new_group()
    watch(job, group, lambda generation, ids: pytest.fail("nobody stalled"))
    assert group.on_slow is not None
    group.on_slow()
    probes_done()
    assert not group.abandoned.is_set() and job.unresponsive == []


def test_a_probe_that_answers_after_the_window_ended_changes_nothing(frozen_url: str) -> None:
    job, group = window_job({"b": frozen_url}), new_group()
    watch(job, group, lambda generation, ids: None)
    slow = group.on_slow
    assert slow is not None
    slow()
    unwatch(group)  # the window's step finished meanwhile (the serving loop owns the group now)
    assert (group.on_slow, group.slow_after_s) == (None, SLOW_AFTER_S)
    probes_done()
    assert not group.abandoned.is_set() and job.unresponsive == []


class Engine:
    """What `resume_or_leave` asks of the engine, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def abandon(self, generation: int, reason: str) -> bool:
        self.calls.append(("abandon", str(generation)))
        return True

    def resume(self) -> None:
        self.calls.append(("resume",))


@pytest.mark.parametrize(
    ("unresponsive", "calls"),
    [
        pytest.param([], [("resume",)], id="every-member-answered"),
        pytest.param(["b"], [("abandon", "1"), ("resume",)], id="an-old-member-froze"),
        pytest.param(["z"], [("resume",)], id="only-a-joiner-froze"),
    ],
)
def test_the_way_back_does_not_resume_a_generation_whose_member_did_not_answer(
    unresponsive: list[str], calls: list[tuple[str, ...]]
) -> None:
    """Given up, the serving loop's first collective leaves the old group and reports it broken (naming
    who stalled): the old generation's first step no longer waits out a deadline on the frozen one."""
    job, engine = window_job({}), Engine()
    job.unresponsive = unresponsive
    resume_or_leave(job, engine)  # type: ignore[arg-type]
    assert engine.calls == calls


class Store:
    """The job's rendezvous store, as far as the window asks it."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.keys[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.keys for k in keys)

    def get(self, key: str) -> bytes:
        return self.keys[key]


def test_a_window_a_peer_gave_up_is_not_switched_into(frozen_url: str) -> None:
    """A member frozen in the window and thawed within its lease: its warm-up may complete from what the
    others sent before they gave the group up; the switch must go back instead, naming why."""
    holder, thawed = window_job({"b": frozen_url}), window_job({})
    store = Store()
    holder.store = thawed.store = store  # type: ignore[assignment]
    group = new_group()
    watch(holder, group, lambda generation, ids: None)
    assert group.on_slow is not None
    group.on_slow()
    wait_until(lambda: store.check([GIVEN_UP_KEY]), timeout_s=30, what="the window given up on the store")
    rolled_back: list[Job] = []
    thawed.paused_monotonic = time.monotonic() - 5.0  # stopped for seconds (it was frozen)
    with pytest.raises(ReconfigError) as refused:
        refuse_if_given_up(thawed, rolled_back.append)
    assert refused.value.type == "window-given-up" and "b" in str(refused.value) and rolled_back == [thawed]
    thawed.paused_monotonic = time.monotonic()  # a window of a few ms: the store is not even asked
    refuse_if_given_up(thawed, rolled_back.append)
    fresh = window_job({})
    fresh.store, fresh.paused_monotonic = Store(), time.monotonic() - 5.0  # type: ignore[assignment]
    refuse_if_given_up(fresh, rolled_back.append)  # nobody gave it up: the switch goes on
    assert rolled_back == [thawed]
