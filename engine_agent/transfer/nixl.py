"""The NIXL weight channel: one-sided READs through NIXL with its UCX backend, as production engines
do. Each receiver pulls the experts it needs straight out of the holders' registered memory (host
memory on CPU, device memory on CUDA); holders do nothing but keep the memory registered until every
reader says it is done."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch

from engine_agent.placement import TransferItem
from engine_agent.protocol import TransferBackend
from engine_agent.transfer.base import (
    ChannelOpening,
    Deadline,
    PlanPart,
    TransferError,
    TransferStats,
    TransferTimeout,
    WeightChannel,
    as_bytes,
    check_in,
    my_part,
    nbytes_of,
    put_bytes,
    wait_for_keys,
)
from engine_agent.transfer.nixl_agent import AgentLease, default_read_threads, new_lease, nixl_errors
from engine_agent.transfer.nixl_standing import STANDING

logger = logging.getLogger(__name__)


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

    def __init__(self, opening: ChannelOpening, *, read_threads: int | None = None) -> None:
        super().__init__(opening)
        engine_id, device = self._me, opening.device
        self._round = 0
        deadline = Deadline(self._timeout_s, self._abort)
        if device.type == "cuda":
            # UCX picks its GPU transports when the agent's worker is created: without a CUDA context
            # by then, device memory registered later cannot be served.
            if device.index is not None:
                torch.cuda.set_device(device)
            torch.empty(1, device=device)
        self._read_threads = read_threads or default_read_threads()
        self._readers = ThreadPoolExecutor(self._read_threads, thread_name_prefix=f"nixl-read-{engine_id}")
        self._peer_agent: dict[str, str] = {}
        self._registrations: list[Any] = []
        self._registered_regions: set[tuple[str, int, int, int]] = set()
        self._clean = True  # every step succeeded so far: at close the agent may serve the next channel
        with nixl_errors(f"{engine_id} starting its NIXL agent"):
            # The engine's standing agent when it is free (`nixl_standing`), else one of our own, with a
            # fresh name. Either has a scrap of this device's memory registered already (`AgentLease`).
            lease = STANDING.borrow(device, self._read_threads)
            if lease is None:
                lease = new_lease(f"{engine_id}/{uuid.uuid4().hex[:12]}", self._read_threads, device)
        self._lease: AgentLease | None = lease
        self._agent: Any = lease.agent
        try:
            self._connect(deadline)
        except BaseException:
            self._clean = False
            self.close()
            raise

    def _connect(self, deadline: Deadline) -> None:
        engine_id, store = self._me, self._store
        with nixl_errors(f"{engine_id} taking its NIXL agent's metadata"):
            metadata = self._agent.get_agent_metadata()
        peers = [engine for engine in self._participants if engine != engine_id]
        check_in(store, "nixl/md", engine_id, peers, deadline, "exchanging NIXL agent metadata", metadata)
        for engine in peers:
            with nixl_errors(f"{engine_id} loading {engine}'s NIXL metadata"):
                name = self._agent.add_remote_agent(store.get(f"nixl/md/{engine}"))
                self._peer_agent[engine] = name.decode() if isinstance(name, bytes) else str(name)
                self._agent.make_connection(self._peer_agent[engine])
        # Nobody leaves open() before everyone has connected: a participant that fails its first
        # round and closes its agent must not turn a peer's connect into "connection refused".
        check_in(
            store, "nixl/connected", engine_id, peers, deadline, "connecting to the NIXL agents of its peers"
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
        try:
            return self._transfer(plan, sources, destinations, on_progress)
        except BaseException:
            self._clean = False  # reads may be left half-done: this agent serves no later channel
            raise

    def _transfer(
        self,
        plan: Sequence[TransferItem],
        sources: Mapping[int, torch.Tensor],
        destinations: Mapping[int, torch.Tensor],
        on_progress: Callable[[int], None] | None,
    ) -> TransferStats:
        started = time.monotonic()
        deadline = Deadline(self._timeout_s, self._abort)
        roles = my_part(plan, self._me, self._participants, sources, destinations)
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
            wait_for_keys(
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
            sent = sum(nbytes_of(sources[item.logical_expert]) for _, item in roles.serve)
        return TransferStats(self.backend, received, sent, time.monotonic() - started)

    def _register(self, tensors: Sequence[torch.Tensor]) -> Any:
        """Register the regions not registered yet; return their registration (None if none is new).

        Registrations live until close(): a channel serves one reconfiguration, and registering a
        region again in a later round makes NIXL refuse the holder's metadata on device memory."""
        fresh, keys = [], []
        for tensor in tensors:
            key = (tensor.device.type, tensor.get_device(), tensor.data_ptr(), nbytes_of(tensor))
            if key not in self._registered_regions and key not in keys:
                fresh.append(tensor)
                keys.append(key)
        if not fresh:
            return None
        registration = self._agent.register_memory(fresh)
        self._registrations.append(registration)
        self._registered_regions.update(keys)
        return registration

    def _publish(self, prefix: str, roles: PlanPart, sources: Mapping[int, torch.Tensor]) -> bool:
        """Register the experts this engine serves and publish where they are. On failure the readers
        are told at once (instead of timing out) and the error is raised here. Returns whether this
        engine serves anything this round."""
        experts = sorted({item.logical_expert for _, item in roles.serve})
        if not experts:
            return False
        key = f"{prefix}/serve/{self._me}"
        try:
            with nixl_errors(f"{self._me} registering the experts it serves"):
                tensors = [as_bytes(sources[expert]) for expert in experts]
                registration = self._register(tensors)
                descriptors = {
                    str(expert): [tensor.data_ptr(), nbytes_of(tensor), max(tensor.get_device(), 0)]
                    for expert, tensor in zip(experts, tensors, strict=True)
                }
                partial = (
                    None
                    if registration is None
                    else self._agent.get_partial_agent_metadata(registration, False)
                )
        except TransferError as error:
            put_bytes(self._store, key, _encode({"error": str(error)}))
            raise
        offer = {
            "metadata": None if partial is None else base64.b64encode(partial).decode(),
            "mem_type": "VRAM" if tensors[0].is_cuda else "DRAM",
            "descriptors": descriptors,
        }
        put_bytes(self._store, key, _encode(offer))
        return True

    def _load_offer(self, holder: str, offer: dict[str, Any]) -> None:
        """Learn where a holder's registered experts are (its partial metadata: memory only)."""
        if "error" in offer:
            raise TransferError(f"{holder} could not serve its experts: {offer['error']}")
        if offer["metadata"] is None:
            return  # nothing new: its regions were loaded in an earlier round
        with nixl_errors(f"loading the NIXL memory metadata of {holder}"):
            self._agent.add_remote_agent(base64.b64decode(offer["metadata"]))

    def _fetch(
        self,
        prefix: str,
        roles: PlanPart,
        destinations: Mapping[int, torch.Tensor],
        deadline: Deadline,
        on_progress: Callable[[int], None] | None,
    ) -> int:
        holders = sorted({item.src for _, item in roles.fetch if item.src is not None})
        landing = [as_bytes(destinations[item.logical_expert]) for _, item in roles.fetch]
        with nixl_errors(f"{self._me} registering its landing buffers"):
            self._register(landing)
        outcome = b"error"
        try:
            wait_for_keys(
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
                put_bytes(self._store, f"{prefix}/done/{holder}/{self._me}", outcome)

    def _read_all(
        self, reads: list[_Read], deadline: Deadline, on_progress: Callable[[int], None] | None
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

    def _read_share(self, share: list[_Read], deadline: Deadline, progress: _Progress) -> None:
        """Post this thread's reads (UCX may copy inside the post), then poll them until done."""
        handles: list[tuple[Any, _Read]] = []
        try:
            for read in share:
                what = f"reading expert {read.item.logical_expert} from {read.item.src}"
                with nixl_errors(what):
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
                    with nixl_errors(f"reading expert {read.item.logical_expert} from {read.item.src}"):
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
                    deadline.check_abort(f"{self._me} reading expert weights")
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
        """Disconnect from the peers and deregister what this channel registered; then the agent goes
        back to the engine's standing slot if every step was clean, else it is dropped."""
        lease, self._lease, self._agent = self._lease, None, None
        if lease is None:
            return
        agent = lease.agent
        for name in self._peer_agent.values():
            try:
                agent.remove_remote_agent(name)
            except Exception:  # the peer may already be gone; nothing to disconnect then
                self._clean = False
                logger.debug("removing NIXL peer %s failed", name, exc_info=True)
        self._readers.shutdown(wait=True)
        for registration in self._registrations:
            try:
                agent.deregister_memory(registration)
            except Exception:
                self._clean = False
                logger.debug("deregistering NIXL memory failed", exc_info=True)
        self._registrations.clear()
        self._registered_regions.clear()
        self._peer_agent.clear()
        del agent
        STANDING.give_back(lease, clean=self._clean)
