"""The weight-transfer channel that moves expert weights between engines during prepare.

Two backends, chosen explicitly per job (never silently):

* `nixl`: one-sided READs through NIXL with its UCX backend, as production engines do. Each receiver
  pulls the experts it needs straight out of the holders' registered memory (host memory on CPU,
  device memory on CUDA); holders do nothing but keep the memory registered until every reader says
  it is done.
* `gloo`: send/recv over a transfer process group built from the same store: the fallback where NIXL
  is not installed.

A channel is opened once per reconfiguration, in prepare, by every participant (old members and new
members alike), with a store prefix private to that generation's transfer. Opening does the slow work
(NIXL agent start-up, metadata exchange, gloo group creation) so that `transfer()` only moves bytes.
Every wait has a deadline: a participant that never arrives fails with `TransferTimeout` naming it.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine_agent.placement import TransferItem
from engine_agent.protocol import TransferBackend

logger = logging.getLogger(__name__)


class TransferError(RuntimeError):
    """The weight transfer failed (bad plan, missing tensor, size mismatch, backend error)."""


class TransferTimeout(TransferError, TimeoutError):
    """A peer did not arrive or did not finish within the channel's timeout."""


@dataclass
class TransferStats:
    backend: TransferBackend
    bytes_received: int
    bytes_sent: int
    seconds: float


class WeightChannel(ABC):
    backend: TransferBackend

    @abstractmethod
    def transfer(
        self,
        plan: Sequence[TransferItem],
        sources: Mapping[int, torch.Tensor],
        destinations: Mapping[int, torch.Tensor],
        on_progress: Callable[[int], None] | None = None,
    ) -> TransferStats:
        """Collective over all participants: every participant calls it with the same plan.

        sources: logical expert -> contiguous 1-D tensor this engine holds (old generation).
        destinations: logical expert -> preallocated contiguous 1-D tensor to fill, for the items with
        dst == me and src not None. Items with src None are not this channel's business (the caller
        loads them from the checkpoint). on_progress(bytes_received_so_far) after each item arrives.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the channel's resources. Idempotent."""


# --------------------------------------------------------------------------------------------------
# Shared helpers


class _Deadline:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._end = time.monotonic() + timeout_s

    def remaining(self) -> float:
        return max(self._end - time.monotonic(), 0.001)

    def expired(self) -> bool:
        return time.monotonic() >= self._end


def _wait_for_keys(store: dist.Store, keys: Mapping[str, str], deadline: _Deadline, what: str) -> None:
    """Wait until every key exists. keys: store key -> the engine it comes from (for the error)."""
    if not keys:
        return
    try:
        store.wait(list(keys), timedelta(seconds=deadline.remaining()))
    except dist.DistStoreError as error:
        missing = sorted({engine for key, engine in keys.items() if not _key_exists(store, key)})
        raise TransferTimeout(
            f"{what}: no word from {', '.join(missing) or 'a peer'} within {deadline.timeout_s:g} s"
        ) from error
    except dist.DistError as error:
        raise TransferError(f"{what}: the rendezvous store failed: {error}") from error


def _put(store: dist.Store, key: str, value: bytes) -> None:
    store.set(key, value)  # type: ignore[arg-type]  # the stubs say str; the store takes bytes too


def _key_exists(store: dist.Store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except dist.DistError:
        return False


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor, so any dtype travels the same way."""
    if not tensor.is_contiguous():
        raise TransferError("transfer tensors must be contiguous")
    return tensor.reshape(-1).view(torch.uint8)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass
class _Roles:
    """The part of a plan that concerns one engine."""

    serve: list[tuple[int, TransferItem]]  # (plan index, item) with src == me
    fetch: list[tuple[int, TransferItem]]  # (plan index, item) with dst == me


def _my_roles(
    plan: Sequence[TransferItem],
    me: str,
    participants: Sequence[str],
    sources: Mapping[int, torch.Tensor],
    destinations: Mapping[int, torch.Tensor],
) -> _Roles:
    known = set(participants)
    roles = _Roles(serve=[], fetch=[])
    for index, item in enumerate(plan):
        if item.src is None:
            continue
        for engine in (item.src, item.dst):
            if engine not in known:
                raise TransferError(f"plan item {item} names {engine}, not a participant of this channel")
        if item.src == item.dst:
            raise TransferError(f"plan item {item} moves an expert onto the engine that holds it")
        if item.src == me:
            if item.logical_expert not in sources:
                raise TransferError(f"{me} must serve expert {item.logical_expert} but does not hold it")
            roles.serve.append((index, item))
        if item.dst == me:
            if item.logical_expert not in destinations:
                raise TransferError(f"{me} has no destination buffer for expert {item.logical_expert}")
            roles.fetch.append((index, item))
    return roles


# --------------------------------------------------------------------------------------------------
# gloo


class GlooChannel(WeightChannel):
    """send/recv per plan item over a ProcessGroupGloo of all participants (rank = index)."""

    backend = TransferBackend.gloo

    def __init__(
        self,
        *,
        engine_id: str,
        participants: Sequence[str],
        store: dist.Store,
        device: torch.device,
        timeout_s: float,
    ) -> None:
        self._me = engine_id
        self._participants = list(participants)
        self._rank_of = {engine: rank for rank, engine in enumerate(self._participants)}
        self._device = device
        self._timeout_s = timeout_s
        # Any: the torch stubs lack ProcessGroupGloo's send/recv/_Options.
        self._group: Any = None
        deadline = _Deadline(timeout_s)
        # Our own barrier first: the group's constructor would wait on the store's timeout (not ours)
        # and fail without naming who is missing.
        _put(store, f"gloo/here/{engine_id}", b"1")
        _wait_for_keys(
            store,
            {f"gloo/here/{engine}": engine for engine in self._participants},
            deadline,
            "opening the gloo transfer group",
        )
        gloo: Any = dist.ProcessGroupGloo
        options = gloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        options._timeout = timedelta(seconds=timeout_s)
        self._group = dist.ProcessGroupGloo(
            dist.PrefixStore("gloo/pg", store), self._rank_of[engine_id], len(self._participants), options
        )

    def transfer(
        self,
        plan: Sequence[TransferItem],
        sources: Mapping[int, torch.Tensor],
        destinations: Mapping[int, torch.Tensor],
        on_progress: Callable[[int], None] | None = None,
    ) -> TransferStats:
        if self._group is None:
            raise TransferError("the gloo channel is closed")
        started = time.monotonic()
        deadline = _Deadline(self._timeout_s)
        roles = _my_roles(plan, self._me, self._participants, sources, destinations)
        sends: list[tuple[dist.Work, int]] = []
        receives: list[tuple[dist.Work, TransferItem, torch.Tensor, torch.Tensor]] = []
        # Post every send and receive at once, in plan order, each tagged with its plan index, so
        # no pair of engines can wait on each other.
        for index, item in sorted(roles.serve + roles.fetch, key=lambda pair: pair[0]):
            if item.src == self._me:
                payload = _as_bytes(sources[item.logical_expert])
                if payload.device.type != "cpu":
                    payload = payload.cpu()  # gloo moves host memory; NIXL is the device path
                work = self._group.send([payload], self._rank_of[item.dst], index)
                sends.append((work, _nbytes(payload)))
            else:
                target = destinations[item.logical_expert]
                landing = _as_bytes(target)
                if landing.device.type != "cpu":
                    landing = torch.empty(landing.numel(), dtype=torch.uint8)
                assert item.src is not None  # _my_roles skips checkpoint items
                work = self._group.recv([landing], self._rank_of[item.src], index)
                receives.append((work, item, target, landing))
        received = 0
        for work, item, target, landing in receives:
            self._wait(work, deadline, f"receiving expert {item.logical_expert} from {item.src}")
            if landing.data_ptr() != target.data_ptr():
                _as_bytes(target).copy_(landing)
            received += landing.numel()
            if on_progress is not None:
                on_progress(received)
        sent = 0
        for work, nbytes in sends:
            self._wait(work, deadline, "sending expert weights")
            sent += nbytes
        return TransferStats(self.backend, received, sent, time.monotonic() - started)

    def _wait(self, work: dist.Work, deadline: _Deadline, what: str) -> None:
        try:
            work.wait(timedelta(seconds=deadline.remaining()))
        except Exception as error:
            if deadline.expired() or "timeout" in str(error).lower() or "timed out" in str(error).lower():
                raise TransferTimeout(f"{what}: not done within {self._timeout_s:g} s") from error
            raise TransferError(f"{what}: {error}") from error

    def close(self) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        try:
            group.shutdown()
        except Exception:  # a broken group cannot shut down cleanly; abort returns at once
            logger.warning("gloo transfer group did not shut down cleanly; aborting it", exc_info=True)
            group.abort()


# --------------------------------------------------------------------------------------------------
# NIXL


def _normalize_ucx_environment() -> None:
    # An empty UCX_TLS makes the UCX backend fail to start: empty means "not set", so treat it so.
    if os.environ.get("UCX_TLS", None) == "":
        logger.warning("UCX_TLS is set but empty; unsetting it so UCX picks its default transports")
        del os.environ["UCX_TLS"]


# Microseconds the NIXL progress thread sleeps between rounds. nixl 1.5.1's Python wrapper hard-codes
# 0, which keeps the thread spinning: measured here, an idle agent burnt 30-60% of a core (2% at
# 10 us), taking CPU from the serving loop that runs beside prepare, and reads were no faster for it.
NIXL_PROGRESS_DELAY_US = 10
_agent_creation = threading.Lock()


class _ProgressDelayBindings:
    """Stands in for nixl's binding module while one agent is built, to set the progress delay the
    wrapper offers no option for."""

    def __init__(self, bindings: Any) -> None:
        self._bindings = bindings

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # the binding's own name
        with contextlib.suppress(AttributeError, TypeError):
            config.pthrDelay = NIXL_PROGRESS_DELAY_US
        return self._bindings.nixlAgent(name, config)


def default_read_threads() -> int:
    """Reader threads (one UCX worker each) per NIXL channel: EPCTL_NIXL_READ_THREADS, else one per
    core up to 8. On one host UCX moves host memory with a single-threaded process_vm_readv per
    worker (about 4 GiB/s each, measured); 8 workers reached 20 GiB/s on a 16-core host."""
    configured = os.environ.get("EPCTL_NIXL_READ_THREADS", "").strip()
    if configured:
        return max(1, int(configured))
    return max(1, min(8, os.cpu_count() or 1))


def _new_nixl_agent(name: str, workers: int = 1) -> Any:
    _normalize_ucx_environment()
    from nixl import _api as nixl_api

    with _agent_creation:
        bindings = nixl_api.nixlBind
        nixl_api.nixlBind = _ProgressDelayBindings(bindings)
        try:
            # RW: reader threads post and poll concurrently; registration stays exclusive.
            config = nixl_api.nixl_agent_config(
                backends=[], sync_mode=nixl_api.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
            )
            agent = nixl_api.nixl_agent(name, config)
        finally:
            nixl_api.nixlBind = bindings
    if "UCX" not in agent.get_plugin_list():
        raise TransferError("NIXL has no UCX plugin")
    agent.create_backend("UCX", {"num_workers": str(workers)})
    return agent


@contextlib.contextmanager
def _nixl_errors(what: str) -> Iterator[None]:
    """NIXL raises its own exception types; callers of the channel see TransferError."""
    try:
        yield
    except TransferError:
        raise
    except Exception as error:
        raise TransferError(f"{what}: {type(error).__name__}: {error}") from error


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def _decode(raw: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(raw.decode())
    return decoded


@dataclass
class _Read:
    """One chunk of one plan item: a READ from the holder's memory into part of the landing tensor."""

    item: TransferItem
    holder: str
    target: torch.Tensor  # uint8 view of part of the destination
    remote: tuple[int, int, int]  # address, bytes, device id at the holder
    mem_type: str  # DRAM or VRAM


class _Progress:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = 0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.bytes += nbytes


class NixlChannel(WeightChannel):
    """Receivers READ the experts they need from the holders' registered memory through NIXL/UCX.

    Reads are cut into chunks spread over `read_threads` threads, each with its own UCX worker: on one
    host UCX copies host memory inside the posting thread, one core per worker. Registrations live
    until close(): keep the tensors alive (and in place) until then."""

    backend = TransferBackend.nixl
    _POLL_S = 0.0002  # between state checks: the UCX progress thread needs the core too
    CHUNK_BYTES = 16 << 20  # reads are cut into pieces of at most this, so threads share big experts

    def __init__(
        self,
        *,
        engine_id: str,
        participants: Sequence[str],
        store: dist.Store,
        device: torch.device,
        timeout_s: float,
        read_threads: int | None = None,
    ) -> None:
        self._me = engine_id
        self._participants = list(participants)
        self._store = store
        self._device = device
        self._timeout_s = timeout_s
        self._round = 0
        deadline = _Deadline(timeout_s)
        if device.type == "cuda":
            # UCX picks its GPU transports when the agent's worker is created: without a CUDA context
            # by then, device memory registered later cannot be served.
            if device.index is not None:
                torch.cuda.set_device(device)
            torch.empty(1, device=device)
        # A fresh name per channel: an engine opens one channel per generation.
        self._read_threads = read_threads or default_read_threads()
        self._readers = ThreadPoolExecutor(self._read_threads, thread_name_prefix=f"nixl-read-{engine_id}")
        with _nixl_errors(f"{engine_id} starting its NIXL agent"):
            self._agent: Any = _new_nixl_agent(f"{engine_id}/{uuid.uuid4().hex[:12]}", self._read_threads)
            # Register a scrap of this device's memory before taking the metadata: UCX sets up the
            # transports for a memory type on its first registration, which changes the connection
            # info, and a peer that loaded the old one then refuses the new (NIXL_ERR_NOT_ALLOWED).
            self._scrap = torch.empty(4096, dtype=torch.uint8, device=device)
            self._scrap_registration = self._agent.register_memory([self._scrap])
            metadata = self._agent.get_agent_metadata()
        self._peer_agent: dict[str, str] = {}
        self._registrations: list[Any] = []
        self._registered_regions: set[tuple[str, int, int, int]] = set()
        _put(store, f"nixl/md/{engine_id}", metadata)
        peers = [engine for engine in self._participants if engine != engine_id]
        _wait_for_keys(
            store,
            {f"nixl/md/{engine}": engine for engine in peers},
            deadline,
            "exchanging NIXL agent metadata",
        )
        for engine in peers:
            with _nixl_errors(f"{engine_id} loading {engine}'s NIXL metadata"):
                name = self._agent.add_remote_agent(store.get(f"nixl/md/{engine}"))
                self._peer_agent[engine] = name.decode() if isinstance(name, bytes) else str(name)
                self._agent.make_connection(self._peer_agent[engine])
        # Nobody leaves open() before everyone has connected: a participant that fails its first
        # round and closes its agent must not turn a peer's connect into "connection refused".
        _put(store, f"nixl/connected/{engine_id}", b"1")
        _wait_for_keys(
            store,
            {f"nixl/connected/{engine}": engine for engine in peers},
            deadline,
            "connecting to the NIXL agents of its peers",
        )

    def transfer(
        self,
        plan: Sequence[TransferItem],
        sources: Mapping[int, torch.Tensor],
        destinations: Mapping[int, torch.Tensor],
        on_progress: Callable[[int], None] | None = None,
    ) -> TransferStats:
        if self._agent is None:
            raise TransferError("the NIXL channel is closed")
        started = time.monotonic()
        deadline = _Deadline(self._timeout_s)
        roles = _my_roles(plan, self._me, self._participants, sources, destinations)
        prefix = f"nixl/round{self._round}"
        self._round += 1

        serving = self._publish(prefix, roles, sources)
        received = 0
        if roles.fetch:
            received = self._fetch(prefix, roles, destinations, deadline, on_progress)
        sent = 0
        if serving:
            # Holders only keep their memory registered while readers read: wait for every one.
            readers = sorted({item.dst for _, item in roles.serve})
            _wait_for_keys(
                self._store,
                {f"{prefix}/done/{self._me}/{reader}": reader for reader in readers},
                deadline,
                f"{self._me} waiting for its readers to finish",
            )
            failed = [
                reader for reader in readers if self._store.get(f"{prefix}/done/{self._me}/{reader}") != b"ok"
            ]
            if failed:
                raise TransferError(f"readers {failed} failed to read from {self._me}")
            sent = sum(_nbytes(sources[item.logical_expert]) for _, item in roles.serve)
        return TransferStats(self.backend, received, sent, time.monotonic() - started)

    def _register(self, tensors: Sequence[torch.Tensor]) -> Any:
        """Register the regions not registered yet; return their registration (None if none is new).

        Registrations live until close(): a channel serves one reconfiguration, and registering a
        region again in a later round makes NIXL refuse the holder's metadata on device memory."""
        fresh, keys = [], []
        for tensor in tensors:
            key = (tensor.device.type, tensor.get_device(), tensor.data_ptr(), _nbytes(tensor))
            if key not in self._registered_regions and key not in keys:
                fresh.append(tensor)
                keys.append(key)
        if not fresh:
            return None
        registration = self._agent.register_memory(fresh)
        self._registrations.append(registration)
        self._registered_regions.update(keys)
        return registration

    def _publish(self, prefix: str, roles: _Roles, sources: Mapping[int, torch.Tensor]) -> bool:
        """Register the experts this engine serves and publish where they are. On failure the readers
        are told at once (instead of timing out) and the error is raised here. Returns whether this
        engine serves anything this round."""
        experts = sorted({item.logical_expert for _, item in roles.serve})
        if not experts:
            return False
        key = f"{prefix}/serve/{self._me}"
        try:
            with _nixl_errors(f"{self._me} registering the experts it serves"):
                tensors = [_as_bytes(sources[expert]) for expert in experts]
                registration = self._register(tensors)
                descriptors = {
                    str(expert): [tensor.data_ptr(), _nbytes(tensor), max(tensor.get_device(), 0)]
                    for expert, tensor in zip(experts, tensors, strict=True)
                }
                partial = (
                    None
                    if registration is None
                    else self._agent.get_partial_agent_metadata(registration, False)
                )
        except TransferError as error:
            _put(self._store, key, _encode({"error": str(error)}))
            raise
        offer = {
            "metadata": None if partial is None else base64.b64encode(partial).decode(),
            "mem_type": "VRAM" if tensors[0].is_cuda else "DRAM",
            "descriptors": descriptors,
        }
        _put(self._store, key, _encode(offer))
        return True

    def _load_offer(self, holder: str, offer: dict[str, Any]) -> None:
        """Learn where a holder's registered experts are (its partial metadata: memory only)."""
        if "error" in offer:
            raise TransferError(f"{holder} could not serve its experts: {offer['error']}")
        if offer["metadata"] is None:
            return  # nothing new: its regions were loaded in an earlier round
        with _nixl_errors(f"loading the NIXL memory metadata of {holder}"):
            self._agent.add_remote_agent(base64.b64decode(offer["metadata"]))

    def _fetch(
        self,
        prefix: str,
        roles: _Roles,
        destinations: Mapping[int, torch.Tensor],
        deadline: _Deadline,
        on_progress: Callable[[int], None] | None,
    ) -> int:
        holders = sorted({item.src for _, item in roles.fetch if item.src is not None})
        landing = [_as_bytes(destinations[item.logical_expert]) for _, item in roles.fetch]
        with _nixl_errors(f"{self._me} registering its landing buffers"):
            self._register(landing)
        outcome = b"error"
        try:
            _wait_for_keys(
                self._store,
                {f"{prefix}/serve/{holder}": holder for holder in holders},
                deadline,
                f"{self._me} waiting for expert holders to publish",
            )
            offers = {holder: _decode(self._store.get(f"{prefix}/serve/{holder}")) for holder in holders}
            for holder, offer in offers.items():
                self._load_offer(holder, offer)
            reads: list[_Read] = []
            for (_, item), target in zip(roles.fetch, landing, strict=True):
                assert item.src is not None
                offer = offers[item.src]
                address, nbytes, device_id = offer["descriptors"][str(item.logical_expert)]
                if nbytes != target.numel():
                    raise TransferError(
                        f"expert {item.logical_expert}: {item.src} holds {nbytes} bytes, "
                        f"{self._me} expects {target.numel()}"
                    )
                for start in range(0, nbytes, self.CHUNK_BYTES):
                    length = min(self.CHUNK_BYTES, nbytes - start)
                    reads.append(
                        _Read(
                            item=item,
                            holder=item.src,
                            target=target[start : start + length],
                            remote=(address + start, length, device_id),
                            mem_type=offer["mem_type"],
                        )
                    )
            received = self._read_all(reads, deadline, on_progress)
            outcome = b"ok"
            return received
        finally:
            for holder in holders:
                _put(self._store, f"{prefix}/done/{holder}/{self._me}", outcome)

    def _read_all(
        self, reads: list[_Read], deadline: _Deadline, on_progress: Callable[[int], None] | None
    ) -> int:
        """Run the reads on the reader threads (chunk i on thread i mod n); report progress from here,
        the calling thread, as chunks land."""
        progress = _Progress()
        shares = [reads[i :: self._read_threads] for i in range(self._read_threads)]
        futures = [
            self._readers.submit(self._read_share, share, deadline, progress) for share in shares if share
        ]
        reported = 0
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.05, return_when=FIRST_EXCEPTION)
            for future in done:
                future.result()  # the first failure (or timeout) of any reader thread
            if on_progress is not None and progress.bytes != reported:
                reported = progress.bytes
                on_progress(reported)
        return progress.bytes

    def _read_share(self, share: list[_Read], deadline: _Deadline, progress: _Progress) -> None:
        """Post this thread's reads (UCX may copy inside the post), then poll them until done."""
        handles: list[tuple[Any, _Read]] = []
        try:
            for read in share:
                what = f"reading expert {read.item.logical_expert} from {read.item.src}"
                with _nixl_errors(what):
                    remote = self._agent.get_xfer_descs([read.remote], read.mem_type)
                    local = self._agent.get_xfer_descs(read.target)
                    handle = self._agent.initialize_xfer("READ", local, remote, self._peer_agent[read.holder])
                    handles.append((handle, read))
                    if self._agent.transfer(handle) == "ERR":
                        raise TransferError(f"{what}: NIXL reported an error when posting the read")
                if deadline.expired():
                    raise TransferTimeout(f"{what}: not done within {self._timeout_s:g} s")
            pending = list(handles)
            while pending:
                still_pending = []
                for handle, read in pending:
                    with _nixl_errors(f"reading expert {read.item.logical_expert} from {read.item.src}"):
                        state = self._agent.check_xfer_state(handle)
                    if state == "DONE":
                        progress.add(read.target.numel())
                    elif state == "ERR":
                        raise TransferError(
                            f"NIXL failed reading expert {read.item.logical_expert} from {read.item.src}"
                        )
                    else:
                        still_pending.append((handle, read))
                pending = still_pending
                if pending:
                    if deadline.expired():
                        late = sorted({read.item.src or "" for _, read in pending})
                        raise TransferTimeout(
                            f"reads from {', '.join(late)} not done within {self._timeout_s:g} s"
                        )
                    time.sleep(self._POLL_S)
        finally:
            for handle, _ in handles:
                with contextlib.suppress(Exception):
                    handle.release()

    def close(self) -> None:
        agent, self._agent = self._agent, None
        if agent is None:
            return
        for name in self._peer_agent.values():
            try:
                agent.remove_remote_agent(name)
            except Exception:  # the peer may already be gone; nothing to disconnect then
                logger.debug("removing NIXL peer %s failed", name, exc_info=True)
        self._readers.shutdown(wait=True)
        for registration in [self._scrap_registration, *self._registrations]:
            with contextlib.suppress(Exception):
                agent.deregister_memory(registration)
        self._registrations.clear()
        self._registered_regions.clear()
        del agent


# --------------------------------------------------------------------------------------------------
# Choosing and opening


def open_channel(
    backend: TransferBackend,
    *,
    engine_id: str,
    participants: Sequence[str],
    store: dist.Store,
    device: torch.device,
    timeout_s: float,
    read_threads: int | None = None,
) -> WeightChannel:
    """Open the channel for one reconfiguration. Every participant (old members and new members) calls
    it with the same participants in the same order. `store` is a PrefixStore private to this
    generation's transfer. Raises TransferTimeout naming the participants that never arrived.
    read_threads (NIXL only): parallel readers, default `default_read_threads()`."""
    if engine_id not in participants:
        raise TransferError(f"{engine_id} is not among the participants {list(participants)}")
    if len(set(participants)) != len(participants):
        raise TransferError(f"participants repeat an engine id: {list(participants)}")
    if backend == TransferBackend.nixl:
        return NixlChannel(
            engine_id=engine_id,
            participants=participants,
            store=store,
            device=device,
            timeout_s=timeout_s,
            read_threads=read_threads,
        )
    if backend == TransferBackend.gloo:
        return GlooChannel(
            engine_id=engine_id, participants=participants, store=store, device=device, timeout_s=timeout_s
        )
    raise TransferError(f"unknown transfer backend {backend!r}")


@functools.cache
def nixl_unavailable_reason() -> str | None:
    """None when NIXL with a UCX agent works in this process, else why not (cached per process)."""
    try:
        agent = _new_nixl_agent(f"probe/{os.getpid()}/{uuid.uuid4().hex[:8]}")
    except ImportError as error:
        return f"nixl is not installed: {error}"
    except Exception as error:
        return f"a NIXL UCX agent cannot be created: {error}"
    del agent
    return None


def available_backends() -> list[TransferBackend]:
    """The backends this engine can use: NIXL when it imports and a UCX agent starts; gloo always."""
    backends = [TransferBackend.gloo]
    if nixl_unavailable_reason() is None:
        backends.insert(0, TransferBackend.nixl)
    return backends


def choose_backend(per_engine: Sequence[Sequence[TransferBackend]]) -> TransferBackend:
    """NIXL if every participant has it, else gloo."""
    if per_engine and all(TransferBackend.nixl in backends for backends in per_engine):
        return TransferBackend.nixl
    return TransferBackend.gloo
