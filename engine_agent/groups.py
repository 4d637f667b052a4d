"""Communicator groups without a global `init_process_group`.

Each agent hosts one TCPStore server from boot; a generation's rendezvous goes through the store named
in its prepare request, under a prefix private to that generation and job. Groups are built directly
(`ProcessGroupGloo` on CPU, `ProcessGroupNCCL` on CUDA/ROCm) so old and new generations can coexist:
the new ("standby") group is built while the old one serves, and the old one is destroyed later by the
cleanup worker.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine_agent.protocol import Platform, StoreAddress


class CollectiveTimeout(RuntimeError):
    """A collective ran past its deadline (or its group broke)."""


class GroupRendezvousTimeout(CollectiveTimeout):
    """Building a group failed: a member did not arrive within the store's deadline."""


def start_store_server(host: str, timeout_s: float) -> dist.TCPStore:
    """The agent's own TCPStore server (port 0: the host picks a free one)."""
    return dist.TCPStore(
        host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )


def connect_store(address: StoreAddress, timeout_s: float) -> dist.TCPStore:
    """A client connection to a (possibly remote) agent's store."""
    return dist.TCPStore(address.host, address.port, is_master=False, timeout=timedelta(seconds=timeout_s))


def prefixed(store: dist.Store, prefix: str) -> dist.PrefixStore:
    return dist.PrefixStore(prefix, store)


def generation_prefix(generation: int, job_id: str) -> str:
    """Keys of one attempt at one generation: a retried job for the same generation never sees the
    stale keys of a failed one."""
    return f"gen{generation}/{job_id}/"


def backend_for(platform: Platform) -> str:
    return "gloo" if platform == Platform.cpu else "nccl"


@dataclass
class CommGroup:
    """One process group of one generation, with the deadline every collective on it gets."""

    name: str
    generation: int
    pg: Any  # ProcessGroupGloo | ProcessGroupNCCL: their stubs share no useful base
    rank: int
    size: int
    device: torch.device
    timeout_s: float
    store: dist.Store | None = field(default=None, repr=False)  # NCCL's lazy init still needs it
    destroyed: bool = False

    def allreduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
        """In-place all-reduce that raises CollectiveTimeout past the group's deadline."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        opts.timeout = timedelta(seconds=self.timeout_s)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # per thread: loop, prepare and pause threads all call this
        try:
            work = self.pg.allreduce([tensor], opts)
            work.wait(timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:
            raise CollectiveTimeout(
                f"all-reduce on {self.name} (generation {self.generation}): {exc}"
            ) from exc
        return tensor


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
) -> CommGroup:
    """Build (rendezvous for) one group. Gloo connects here, so every member must arrive within the
    store's timeout; NCCL makes its communicator at the first collective (the warm-up)."""
    try:
        if platform == Platform.cpu:
            opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            opts._timeout = timedelta(seconds=timeout_s)
            # Explicit loopback device: the host name need not resolve.
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
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
    return CommGroup(name, generation, pg, rank, size, device, timeout_s, store)


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
