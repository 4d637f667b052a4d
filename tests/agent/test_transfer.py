"""The weight-transfer channel moves the exact bytes between real processes, over NIXL and over gloo,
and a peer that never comes fails fast with TransferTimeout instead of hanging."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

from engine_agent.placement import TransferItem, plan_transfers
from engine_agent.protocol import TransferBackend
from engine_agent.transfer import (
    TransferAborted,
    TransferError,
    available_backends,
    open_channel,
)
from tests.agent.transfer_worker import HARNESS_TIMEOUT_S, RELEASE_KEY, run_participant
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes

# b leaves (the only holder of experts 2 and 3), c joins, a stays and also serves; expert 4 is new
# to everyone (checkpoint load, not the channel's business).
OLD_MEMBERS = ["a", "b"]
OLD_PLACEMENT = [[0, 1], [2, 3]]
NEW_MEMBERS = ["a", "c"]
NEW_PLACEMENT = [[0, 2, 4], [1, 2, 3]]
PARTICIPANTS = ["a", "b", "c"]
NUMEL = {0: 1000, 1: 70_001, 2: 262_144, 3: 5, 4: 64}  # odd sizes on purpose
HELD = {"a": [0, 1], "b": [2, 3], "c": []}


def backend_params() -> list[Any]:
    nixl_ready = TransferBackend.nixl in available_backends()
    return [
        pytest.param(
            "nixl", marks=pytest.mark.skipif(not nixl_ready, reason="NIXL with UCX is unavailable here")
        ),
        "gloo",
    ]


def forkserver() -> Any:
    """Participants forked from multiprocessing's fork server, which imports torch and the channels
    once (`set_forkserver_preload`) instead of once per participant as a spawned process does: a
    fresh single-threaded process per participant all the same."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.agent.transfer_worker"])
    return context


def run_participants(
    backend: str,
    engines: list[str],
    participants: list[str],
    plan: list[TransferItem],
    timeout_s: float,
    absent_from_transfer: frozenset[str] = frozenset(),
    broken_sources: frozenset[str] = frozenset(),
) -> dict[str, dict[str, Any]]:
    """Start one process per engine, return each one's report; always reap them."""
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    context = forkserver()
    results = context.Queue()
    processes = [
        context.Process(
            target=run_participant,
            args=(backend, e, participants, store.port, plan, HELD[e], NUMEL, timeout_s, results, engines),
            kwargs={"absent_from_transfer": e in absent_from_transfer, "broken_sources": e in broken_sources},
            daemon=True,
        )
        for e in engines
    ]
    reports: dict[str, dict[str, Any]] = {}
    try:
        for process in processes:
            process.start()
        # A guard against hangs only: starting the fork server (torch's import) on a loaded host is slow.
        deadline = time.monotonic() + 3 * HARNESS_TIMEOUT_S
        while len(reports) < len(processes):
            try:
                report = results.get(timeout=0.5)
            except queue.Empty:
                # A participant that died without a report (or a hang) must fail, not wait forever.
                if time.monotonic() > deadline or not any(p.is_alive() for p in processes):
                    pytest.fail(f"participants gave no report; reports so far: {reports}")
                continue
            reports[report["engine"]] = report
            if set(reports) >= set(engines) - absent_from_transfer:
                store.set(RELEASE_KEY, "1")  # the stalled peers may close now: everyone else is done
        return reports
    finally:
        for process in processes:
            if process.pid is None:
                continue
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()


@pytest.fixture(scope="module", params=backend_params())
def moved(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, dict[str, Any]]]]:
    plan = plan_transfers(OLD_MEMBERS, OLD_PLACEMENT, NEW_MEMBERS, NEW_PLACEMENT)
    yield request.param, run_participants(request.param, PARTICIPANTS, PARTICIPANTS, plan, timeout_s=20)


def test_the_plan_uses_the_leaver_and_a_stayer_as_sources() -> None:
    plan = plan_transfers(OLD_MEMBERS, OLD_PLACEMENT, NEW_MEMBERS, NEW_PLACEMENT)
    assert plan == [
        TransferItem(1, "a", "c"),
        TransferItem(2, "b", "a"),
        TransferItem(2, "b", "c"),
        TransferItem(3, "b", "c"),
        TransferItem(4, None, "a"),
    ]


def test_every_participant_finishes_without_error(moved: tuple[str, dict[str, dict[str, Any]]]) -> None:
    _, reports = moved
    assert {engine: report.get("traceback") for engine, report in reports.items()} == dict.fromkeys(
        PARTICIPANTS
    )


def test_receivers_get_the_exact_bytes(moved: tuple[str, dict[str, dict[str, Any]]]) -> None:
    _, reports = moved
    assert reports["a"]["exact"] == {2: True}
    assert reports["c"]["exact"] == {1: True, 2: True, 3: True}


def test_stats_count_the_bytes_each_way(moved: tuple[str, dict[str, dict[str, Any]]]) -> None:
    backend, reports = moved
    size = {e: n * 4 for e, n in NUMEL.items()}
    assert tuple(reports["a"]["stats"]) == (backend, size[2], size[1])
    assert tuple(reports["b"]["stats"]) == (backend, 0, 2 * size[2] + size[3])
    assert tuple(reports["c"]["stats"]) == (backend, size[1] + size[2] + size[3], 0)


def test_progress_reports_grow_to_the_bytes_received(moved: tuple[str, dict[str, dict[str, Any]]]) -> None:
    _, reports = moved
    progress = reports["c"]["progress"]
    assert progress
    assert progress == sorted(set(progress))
    assert progress[-1] == reports["c"]["stats"][1]


@pytest.mark.parametrize("backend", backend_params())
def test_a_participant_that_never_arrives_times_out_naming_it(backend: str) -> None:
    plan = [TransferItem(0, "a", "ghost")]
    reports = run_participants(backend, ["a", "b"], ["a", "b", "ghost"], plan, timeout_s=1.5)
    for engine in ("a", "b"):
        assert reports[engine]["error_type"] == "TransferTimeout", reports[engine].get("traceback")
        assert reports[engine]["is_timeout"]
        assert "ghost" in reports[engine]["error"]


@pytest.mark.parametrize("backend", backend_params())
def test_a_holder_that_never_serves_times_out_its_reader(backend: str) -> None:
    plan = [TransferItem(2, "b", "c")]
    # b opens the channel and stays up with its end open, but never joins the transfer. The reader's
    # deadline bounds its open too: ample for that, it is what the transfer waits for b in vain.
    reports = run_participants(
        backend, ["b", "c"], ["b", "c"], plan, timeout_s=5.0, absent_from_transfer=frozenset({"b"})
    )
    assert reports["c"]["error_type"] == "TransferTimeout", reports["c"].get("traceback")
    assert reports["c"]["failed_in"] == "transfer", reports["c"].get("traceback")
    assert "b" in reports["c"]["error"]
    assert reports["b"].get("traceback") is None


@pytest.mark.skipif(TransferBackend.nixl not in available_backends(), reason="NIXL is unavailable here")
def test_a_holder_that_cannot_serve_fails_its_reader_at_once_naming_it() -> None:
    plan = [TransferItem(2, "b", "c")]
    reports = run_participants(
        "nixl", ["b", "c"], ["b", "c"], plan, timeout_s=30, broken_sources=frozenset({"b"})
    )
    assert reports["b"]["error_type"] == "TransferError"
    assert reports["c"]["error_type"] == "TransferError", reports["c"].get("traceback")
    assert "b could not serve its experts" in reports["c"]["error"]
    assert not reports["c"]["is_timeout"]


def test_gloo_is_always_available() -> None:
    assert TransferBackend.gloo in available_backends()


def test_opening_a_channel_for_an_engine_outside_the_participants_is_refused() -> None:
    store = dist.HashStore()
    with pytest.raises(TransferError, match="not among the participants"):
        open_channel(
            TransferBackend.gloo,
            engine_id="z",
            participants=["a", "b"],
            store=store,
            device=__import__("torch").device("cpu"),
            timeout_s=1,
        )


@pytest.mark.parametrize("backend", backend_params())
def test_an_abort_ends_the_wait_for_a_peer_that_never_comes(backend: str) -> None:
    """A dead participant never comes: the job's abort, not the (long) channel deadline, ends the wait."""
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    abort = threading.Event()
    outcome: list[BaseException | None] = []

    def open_for_a() -> None:
        try:
            open_channel(
                TransferBackend(backend),
                engine_id="a",
                participants=["a", "ghost"],
                store=store,
                device=torch.device("cpu"),
                timeout_s=3600.0,
                abort=abort,
            )
            outcome.append(None)
        except BaseException as error:  # reported below
            outcome.append(error)

    opener = threading.Thread(target=open_for_a, daemon=True)
    opener.start()
    prefix = "gloo/here/a" if backend == "gloo" else "nixl/md/a"
    wait_until(lambda: store.check([prefix]), timeout_s=HARNESS_TIMEOUT_S, what="a waiting for ghost")
    abort.set()
    opener.join(timeout=HARNESS_TIMEOUT_S)  # a guard against hangs: the deadline is an hour away
    assert not opener.is_alive()
    assert isinstance(outcome[0], TransferAborted), outcome
