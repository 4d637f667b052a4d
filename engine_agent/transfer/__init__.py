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

Modules: `base` (the interface, errors, stats), `gloo`, `nixl` (the channel), `nixl_agent` (building
a NIXL agent, the progress-thread patch, the availability probe) and `nixl_standing` (the engine's
standing agent, lent to one channel at a time).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist

from engine_agent.protocol import TransferBackend
from engine_agent.transfer.base import (
    ChannelOpening,
    TransferAborted,
    TransferError,
    TransferStats,
    TransferTimeout,
    WeightChannel,
)
from engine_agent.transfer.gloo import GlooChannel
from engine_agent.transfer.nixl import NixlChannel
from engine_agent.transfer.nixl_agent import nixl_unavailable_reason
from engine_agent.transfer.nixl_standing import start_standing_agent

__all__ = [
    "TransferAborted",
    "TransferError",
    "TransferStats",
    "TransferTimeout",
    "WeightChannel",
    "available_backends",
    "nixl_unavailable_reason",
    "open_channel",
    "start_standing_agent",
]


def open_channel(
    backend: TransferBackend,
    *,
    engine_id: str,
    participants: Sequence[str],
    store: dist.Store,
    device: torch.device,
    timeout_s: float,
    read_threads: int | None = None,
    abort: threading.Event | None = None,
    data_host: str = "127.0.0.1",
) -> WeightChannel:
    """Open the channel for one reconfiguration. Every participant (old members and new members) calls
    it with the same participants in the same order. `store` is a PrefixStore private to this
    generation's transfer. Raises TransferTimeout naming the participants that never arrived.
    read_threads (NIXL only): parallel readers, default `default_read_threads()`. `abort` set (the job's
    abort) ends the channel's waits for peers at once with TransferAborted."""
    if engine_id not in participants:
        raise TransferError(f"{engine_id} is not among the participants {list(participants)}")
    if len(set(participants)) != len(participants):
        raise TransferError(f"participants repeat an engine id: {list(participants)}")
    opening = ChannelOpening(engine_id, tuple(participants), store, device, timeout_s, abort, data_host)
    if backend == TransferBackend.nixl:
        return NixlChannel(opening, read_threads=read_threads)
    if backend == TransferBackend.gloo:
        return GlooChannel(opening)
    raise TransferError(f"unknown transfer backend {backend!r}")


def available_backends() -> list[TransferBackend]:
    """The backends this engine can use: NIXL when it imports and a UCX agent starts; gloo always."""
    backends = [TransferBackend.gloo]
    if nixl_unavailable_reason() is None:
        backends.insert(0, TransferBackend.nixl)
    return backends
