"""What every weight channel shares: the interface, its errors and stats, and the helpers both backends
use (deadlines, store waits that name the missing peer, byte views, the part of a plan that concerns
one engine)."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from engine_agent.placement import TransferItem
from engine_agent.protocol import TransferBackend


class TransferError(RuntimeError):
    """The weight transfer failed (bad plan, missing tensor, size mismatch, backend error)."""


class TransferTimeout(TransferError, TimeoutError):
    """A peer did not arrive or did not finish within the channel's timeout."""


class TransferAborted(TransferError):
    """The job was aborted while the channel waited for a peer."""


@dataclass
class TransferStats:
    backend: TransferBackend
    bytes_received: int
    bytes_sent: int
    seconds: float


@dataclass(frozen=True)
class ChannelOpening:
    """What every backend is opened with: this engine, all participants (the same list, in the same
    order, on every one of them), the store private to this generation's transfer, the tensors' device,
    how long a wait for a peer may take, and the job's abort, which ends those waits early."""

    engine_id: str
    participants: tuple[str, ...]
    store: dist.Store
    device: torch.device
    timeout_s: float
    abort: threading.Event | None = None
    data_host: str = "127.0.0.1"  # this engine's data address: what the channel binds


class WeightChannel(ABC):
    backend: TransferBackend

    def __init__(self, opening: ChannelOpening) -> None:
        self._me = opening.engine_id
        self._participants = list(opening.participants)
        self._store = opening.store
        self._device = opening.device
        self._timeout_s = opening.timeout_s
        self._abort = opening.abort

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


# A wait that an abort may end is taken in slices of this (seconds).
ABORT_POLL_S = 0.1


class Deadline:
    """A channel wait's end, and the job's abort, which ends it early (a peer that died will never
    come: the survivors must not wait out the deadline)."""

    def __init__(self, timeout_s: float, abort: threading.Event | None = None) -> None:
        self.timeout_s = timeout_s
        self.abort = abort
        self._end = time.monotonic() + timeout_s

    def remaining(self) -> float:
        return max(self._end - time.monotonic(), 0.001)

    def expired(self) -> bool:
        return time.monotonic() >= self._end

    def check_abort(self, what: str) -> None:
        if self.abort is not None and self.abort.is_set():
            raise TransferAborted(f"{what}: the job was aborted")


def wait_for_keys(store: dist.Store, keys: Mapping[str, str], deadline: Deadline, what: str) -> None:
    """Wait until every key exists. keys: store key -> the engine it comes from (for the error)."""
    if not keys:
        return
    while True:
        deadline.check_abort(what)
        # In slices when an abort can end the wait (a store wait's timeout changes nothing).
        slice_s = deadline.remaining() if deadline.abort is None else min(deadline.remaining(), ABORT_POLL_S)
        try:
            store.wait(list(keys), timedelta(seconds=slice_s))
            return
        except dist.DistStoreError as error:
            if not deadline.expired() and deadline.abort is not None:
                continue
            missing = sorted({engine for key, engine in keys.items() if not key_exists(store, key)})
            raise TransferTimeout(
                f"{what}: no word from {', '.join(missing) or 'a peer'} within {deadline.timeout_s:g} s"
            ) from error
        except dist.DistError as error:
            raise TransferError(f"{what}: the rendezvous store failed: {error}") from error


def check_in(
    store: dist.Store,
    prefix: str,
    me: str,
    engines: Sequence[str],
    deadline: Deadline,
    what: str,
    value: bytes = b"1",
) -> None:
    """Publish `value` under `prefix/me`, then wait for `prefix/<engine>` of every one of `engines`: a
    barrier (or an exchange, when `value` says something) that names whoever never came."""
    put_bytes(store, f"{prefix}/{me}", value)
    wait_for_keys(store, {f"{prefix}/{engine}": engine for engine in engines}, deadline, what)


def put_bytes(store: dist.Store, key: str, value: bytes) -> None:
    store.set(key, value)  # type: ignore[arg-type]  # the stubs say str; the store takes bytes too


def key_exists(store: dist.Store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except dist.DistError:
        return False


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor, so any dtype travels the same way."""
    if not tensor.is_contiguous():
        raise TransferError("transfer tensors must be contiguous")
    return tensor.reshape(-1).view(torch.uint8)


def nbytes_of(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass
class PlanPart:
    """The part of a plan that concerns one engine."""

    serve: list[tuple[int, TransferItem]]  # (plan index, item) with src == me
    fetch: list[tuple[int, TransferItem]]  # (plan index, item) with dst == me


def my_part(
    plan: Sequence[TransferItem],
    me: str,
    participants: Sequence[str],
    sources: Mapping[int, torch.Tensor],
    destinations: Mapping[int, torch.Tensor],
) -> PlanPart:
    known = set(participants)
    roles = PlanPart(serve=[], fetch=[])
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
