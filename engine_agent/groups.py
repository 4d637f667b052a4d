"""Communicator groups without a global `init_process_group`.

Each agent hosts one TCPStore server from boot; a generation's rendezvous goes through the store named
in its prepare request, under a prefix private to that generation and job. Groups are built directly
(`ProcessGroupGloo` on CPU, `ProcessGroupNCCL` on CUDA/ROCm) so old and new generations can coexist:
the new ("standby") group is built while the old one serves, and the old one is destroyed later by the
cleanup worker.

A serving collective is waited in slices (`WAIT_SLICE_S`) on CPU, so the serving loop can give up on it
the moment the group is known broken (`CommGroup.abandon`: a peer or the coordinator reported it, or this
engine saw it break; past `SLOW_AFTER_S` the engine says it is stuck, and the coordinator fences a frozen
peer on that and tells the others to leave, issue 39): gloo cannot abort a collective in flight
(`ProcessGroupGloo.abort` does not end a peer's wait), so without this a survivor whose ring neighbours
were alive sat out the whole deadline. An abandoned group is kept alive by a reaper until its last
collective has timed out, because dropping a gloo group joins its worker threads, which would block
whichever thread let go of it; until then that collective still runs in gloo's threads (a frozen peer
that thaws meanwhile can complete it: the coordinator keeps such a peer fenced).

On a GPU a collective's completion is polled (`CommGroup._poll`) against its deadline rather than
waited with NCCL's timed wait, which sleeps a millisecond between checks; the collectives inside a
serving step are not waited on the host at all (the stream orders them), and the step's end waits for
the device once, with the same deadline (`CommGroup.wait_device`).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine_agent.protocol import Platform, StoreAddress


class CollectiveTimeout(RuntimeError):
    """A collective ran past its deadline (or its group broke)."""


class PeerLost(CollectiveTimeout):
    """A peer's connection dropped mid-collective (gloo: "Connection reset by peer", "Broken pipe",
    "Connection closed by peer"): the peer left or died; no deadline passed."""


# What gloo (and the socket layer under it) says when the other end went away.
_PEER_GONE = ("connection reset by peer", "broken pipe", "connection closed by peer", "connection refused")


def collective_failed(what: str, exc: BaseException) -> CollectiveTimeout:
    """The error for a collective that failed with `exc`: `PeerLost`, named for what happened, when a
    peer's connection dropped; `CollectiveTimeout` otherwise."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = next((line for line in lines if any(sign in line.lower() for sign in _PEER_GONE)), None)
    if said is not None:
        return PeerLost(f"{what}: a peer left or died (its connection dropped): {said}")
    return CollectiveTimeout(f"{what}: {exc}")


class GroupAbandoned(CollectiveTimeout):
    """The group was given up (broken, as a peer or this engine found): its collectives end at once."""


# A serving collective this slow (far above a step, even a loaded host's): who stalled is asked, and the
# coordinator told (issue 39: a frozen member is fenced on that evidence, not at the serving deadline).
SLOW_AFTER_S = 0.5
WAIT_SLICE_S = 0.05  # a CPU collective is waited in slices of this: an abandoned group is left within one
POLL_SPIN_S = 0.005  # a GPU operation's completion is polled without a pause this long, then every
POLL_SLEEP_S = 0.0002  # this


class GroupRendezvousTimeout(CollectiveTimeout):
    """Building a group failed: a member did not arrive within the store's deadline."""


def start_store_server(host: str, timeout_s: float) -> dist.TCPStore:
    """The agent's own TCPStore server on `host` only (port 0: the host picks a free one).

    TCPStore given a host still listens on every interface (`*:port`): its server ignores the host.
    So the listening socket is made here, bound to the data address, and handed over
    (`master_listen_fd`, which the libuv backend accepts). TCPStore has no authentication: anyone who
    reaches this port can read and write keys, so the data network must be private (docs/agent.md);
    each generation's keys sit under the job's unguessable `store_prefix` besides."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    listener.listen(4096)
    store = dist.TCPStore(
        host,
        listener.getsockname()[1],
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
        master_listen_fd=listener.fileno(),
        use_libuv=True,
    )
    _LISTENERS.append(listener)  # the store serves on this descriptor: it must stay open
    return store


_LISTENERS: list[socket.socket] = []


def connect_store(address: StoreAddress, timeout_s: float) -> dist.TCPStore:
    """A client connection to a (possibly remote) agent's store."""
    return dist.TCPStore(address.host, address.port, is_master=False, timeout=timedelta(seconds=timeout_s))


def prefixed(store: dist.Store, prefix: str) -> dist.PrefixStore:
    return dist.PrefixStore(prefix, store)


def generation_prefix(generation: int, job_id: str, secret: str = "") -> str:
    """Keys of one attempt at one generation: a retried job for the same generation never sees the
    stale keys of a failed one; `secret` (the job's `store_prefix`, random) makes them unguessable."""
    return f"gen{generation}/{job_id}/{secret}/" if secret else f"gen{generation}/{job_id}/"


@dataclass
class CommGroup:
    """One process group of one generation, with the deadline every collective on it gets.

    `timeout_s` bounds every collective (the job's `collective_s`: a member may be building or
    switching); `serving_timeout_s`, when set, bounds a serving collective once every member is known
    to be serving (see `ReferenceEngine`): then a peer that stalls longer is treated as lost."""

    name: str
    generation: int
    pg: Any  # ProcessGroupGloo | ProcessGroupNCCL: their stubs share no useful base
    rank: int
    size: int
    device: torch.device
    timeout_s: float
    store: dist.Store | None = field(default=None, repr=False)  # NCCL's lazy init still needs it
    destroyed: bool = False
    serving_timeout_s: float | None = None
    abandoned: threading.Event = field(default_factory=threading.Event, repr=False)
    abandon_reason: str = ""
    # Called once when a serving collective has waited `slow_after_s` (far above any step): the
    # engine starts finding out who stalled, so the evidence is there by the serving deadline.
    on_slow: Callable[[], None] | None = field(default=None, repr=False)
    slow_after_s: float = SLOW_AFTER_S
    # When the collective this engine waits on now started (monotonic; None: not waiting): how long it
    # has been stuck is read from here by the heartbeat (`stuck_s`).
    waiting_since: float | None = field(default=None, repr=False)

    def stuck_s(self, now: float | None = None) -> float | None:
        """How long the collective waited on now has waited, once past `slow_after_s`; else None."""
        since = self.waiting_since
        if since is None:
            return None
        waited = (time.monotonic() if now is None else now) - since
        return waited if waited >= self.slow_after_s else None

    def abandon(self, reason: str) -> bool:
        """Give the group up: a collective waiting on it (or started later) raises GroupAbandoned
        within one wait slice. False when it was given up already."""
        if self.abandoned.is_set():
            return False
        self.abandon_reason = reason
        self.abandoned.set()
        return True

    def allreduce(
        self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, *, timeout_s: float | None = None
    ) -> torch.Tensor:
        """In-place all-reduce that raises CollectiveTimeout past its deadline (`timeout_s`, default
        the group's) and GroupAbandoned once the group is given up."""
        deadline = timeout_s or self.timeout_s
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        opts.timeout = timedelta(seconds=deadline)
        what = f"all-reduce on {self.name} (generation {self.generation})"
        self._check_abandoned(what)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # per thread: loop, prepare and pause threads all call this
        try:
            work = self.pg.allreduce([tensor], opts)
        except RuntimeError as exc:
            raise collective_failed(what, exc) from exc
        self._wait(work, what, deadline)
        return tensor

    def alltoall(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        *,
        timeout_s: float | None = None,
        in_step: bool = False,
    ) -> torch.Tensor:
        """Rows of `input` to each member (`input_splits` rows each, in rank order) into `output`
        (`output_splits` rows from each): one exchange round, where a ring all-reduce takes 2(n-1).

        `in_step` on a GPU: the host does not wait for it; the device's stream does (what follows on
        the stream runs after it), and the step's end (`wait_device`) holds the deadline."""
        deadline = timeout_s or self.timeout_s
        opts = dist.AllToAllOptions()
        opts.timeout = timedelta(seconds=deadline)
        what = f"all-to-all on {self.name} (generation {self.generation})"
        self._check_abandoned(what)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            work = self.pg.alltoall_base(output, input, output_splits, input_splits, opts)
        except RuntimeError as exc:
            raise collective_failed(what, exc) from exc
        if in_step and self.device.type == "cuda":
            work.wait()  # no timeout: the stream waits on it, the host does not
            return output
        self._wait(work, what, deadline)
        return output

    def wait_device(self, timeout_s: float | None = None) -> None:
        """Wait until the device has done everything queued so far on this thread's stream (a step's
        collectives and compute), within the deadline (`timeout_s`, default the group's). A collective
        that never completes (a peer stalled or gone) raises CollectiveTimeout, as a timed wait would."""
        if self.device.type != "cuda":
            return
        event = torch.cuda.Event()
        event.record()
        self._poll(event.query, "the step's collectives and compute", timeout_s or self.timeout_s)

    def _poll(self, done: Callable[[], bool], what: str, deadline_s: float) -> None:
        """Until `done()`: a busy loop for the first POLL_SPIN_S (a step's collectives end within
        microseconds to a millisecond, and each release of the GIL can cost a switch interval to take
        back while another thread runs Python), then a short sleep between checks (a long wait)."""
        started = time.monotonic()
        give_up = started + deadline_s
        spin_until = started + POLL_SPIN_S
        slow_told = self.on_slow is None
        self.waiting_since = started
        try:
            while not done():
                now = time.monotonic()
                if self.abandoned.is_set():
                    raise GroupAbandoned(f"{what}: the group was given up ({self.abandon_reason})")
                if now > give_up:
                    raise CollectiveTimeout(f"{what}: not done within {deadline_s:g} s")
                if not slow_told and now - started >= self.slow_after_s and self.on_slow is not None:
                    slow_told = True  # as the CPU wait does: who stalled is known by the deadline
                    self.on_slow()
                if now > spin_until:
                    time.sleep(POLL_SLEEP_S)
        finally:
            self.waiting_since = None

    def check_abandoned(self, what: str) -> None:
        """Raise GroupAbandoned once the group is given up (what a collective on it would do)."""
        self._check_abandoned(what)

    def _check_abandoned(self, what: str) -> None:
        if self.abandoned.is_set():
            raise GroupAbandoned(f"{what}: the group was given up ({self.abandon_reason})")

    def _wait(self, work: Any, what: str, deadline_s: float) -> None:
        if self.device.type == "cuda":
            # Polled here, not `work.wait(timeout)`: NCCL's timed wait sleeps a whole millisecond between
            # its checks, which was most of a step. A broken NCCL group is aborted for real
            # (`abort_group`), which ends the peers' waits; its failed work reads as completed.
            self._poll(work.is_completed, what, deadline_s)
            try:
                work.wait()  # completed: returns at once (raising the work's own error, if it failed)
            except RuntimeError as exc:
                raise collective_failed(what, exc) from exc
            return
        started = self.waiting_since = time.monotonic()
        try:
            self._wait_cpu(work, what, deadline_s, started)
        finally:
            self.waiting_since = None

    def _wait_cpu(self, work: Any, what: str, deadline_s: float, started: float) -> None:
        # Gloo ends the operation itself at `deadline_s` (a peer's error ends it sooner); the
        # backstop only guards against a work that never completes.
        backstop = started + deadline_s + 1.0
        slow_told = self.on_slow is None
        while True:
            try:
                work.wait(timedelta(seconds=WAIT_SLICE_S))
                return
            except RuntimeError as exc:
                if work.is_completed():
                    # It ended after the slice ran out (a success, or its own error): waiting again
                    # returns at once, or raises that error. Never take the slice's timeout for its.
                    try:
                        work.wait(timedelta(seconds=WAIT_SLICE_S))
                    except RuntimeError as failed:
                        raise collective_failed(what, failed) from failed
                    return
                if time.monotonic() > backstop:
                    raise collective_failed(what, exc) from exc
            # Not done yet: the slice ran out. Still wanted?
            if not slow_told and time.monotonic() - started >= self.slow_after_s and self.on_slow is not None:
                slow_told = True
                self.on_slow()
            if self.abandoned.is_set():
                _bury(self)
                raise GroupAbandoned(f"{what}: the group was given up ({self.abandon_reason})")


def create_group(
    *,
    name: str,
    generation: int,
    store: dist.Store,
    rank: int,
    size: int,
    platform: Platform,
    device: torch.device,
    timeout_s: float,
    serving_timeout_s: float | None = None,
    device_host: str = "127.0.0.1",
) -> CommGroup:
    """Build (rendezvous for) one group. Gloo connects here, so every member must arrive within the
    store's timeout; NCCL makes its communicator at the first collective (the warm-up)."""
    try:
        if platform == Platform.cpu:
            opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            opts._timeout = timedelta(seconds=timeout_s)
            # The engine's data address, explicitly: the host name need not resolve, and peers on other
            # hosts connect to what the device binds.
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=device_host)]
            pg: Any = dist.ProcessGroupGloo(store, rank, size, opts)
        else:
            nccl_opts = dist.ProcessGroupNCCL.Options()
            nccl_opts._timeout = timedelta(seconds=timeout_s)
            torch.cuda.set_device(device)
            pg = dist.ProcessGroupNCCL(store, rank, size, nccl_opts)
    except RuntimeError as exc:  # gloo's rendezvous failure surfaces as a store timeout
        raise GroupRendezvousTimeout(
            f"creating {name} (generation {generation}, rank {rank}/{size}): {exc}"
        ) from exc
    return CommGroup(
        name, generation, pg, rank, size, device, timeout_s, store, serving_timeout_s=serving_timeout_s
    )


def warm_up(group: CommGroup) -> None:
    """The first collective on a group (NCCL builds its communicator here)."""
    group.allreduce(torch.ones(1, device=group.device))


def destroy_group(group: CommGroup) -> None:
    """Shut a group down (abort if shutdown fails: a broken group must not keep the worker)."""
    if group.destroyed:
        return
    group.destroyed = True
    try:
        group.pg.shutdown()
    except Exception:
        group.pg.abort()
        raise


def abort_group(group: CommGroup, reason: str = "aborted") -> None:
    """Tear a broken group down at once (no shutdown handshake with peers that may be dead or stuck).
    NCCL's abort ends the peers' pending collectives; gloo's does not (the peers hear of it from this
    engine's notice instead, `engine_agent.agent`), so a gloo group is only given up and buried."""
    group.abandon(reason)
    if group.destroyed:
        return
    group.destroyed = True
    if group.device.type == "cuda":
        group.pg.abort()
    else:
        _bury(group)


# Abandoned gloo groups, kept until their last collective timed out (see the module doc).
_graveyard: queue.Queue[tuple[float, CommGroup]] = queue.Queue()
_reaper: threading.Thread | None = None
_reaper_lock = threading.Lock()


def _bury(group: CommGroup) -> None:
    global _reaper
    _graveyard.put((time.monotonic() + group.timeout_s + 5.0, group))
    with _reaper_lock:
        if _reaper is None:
            _reaper = threading.Thread(target=_reap, name="group-reaper", daemon=True)
            _reaper.start()


def _reap() -> None:
    while True:
        due, group = _graveyard.get()
        time.sleep(max(0.0, due - time.monotonic()))
        del group  # the last reference, dropped here (joining its threads blocks only this thread)


class StandbyRegistry:
    """The groups built for a generation that is not active yet, by name. The switch takes them out;
    an abort destroys them."""

    def __init__(self) -> None:
        self._groups: dict[str, CommGroup] = {}
        self._lock = threading.Lock()

    def add(self, group: CommGroup) -> None:
        with self._lock:
            self._groups[group.name] = group

    def get(self, name: str) -> CommGroup | None:
        with self._lock:
            return self._groups.get(name)

    def take_all(self) -> dict[str, CommGroup]:
        with self._lock:
            groups, self._groups = self._groups, {}
            return groups

    def destroy_all(self) -> list[str]:
        """Destroy every standby group; returns errors (best effort, never raises)."""
        errors = []
        for group in self.take_all().values():
            try:
                destroy_group(group)
            except Exception as exc:
                errors.append(f"{group.name}: {exc}")
        return errors
