"""One participant of a weight-transfer test, run in its own process (multiprocessing spawn)."""

from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine_agent.placement import TransferItem
from engine_agent.protocol import TransferBackend
from engine_agent.transfer import open_channel
from engine_agent.transfer.nixl import NixlChannel

HARNESS_TIMEOUT_S = 120.0  # for the test's own waits, never the one under test
STARTED_PREFIX = "test/started/"
RELEASE_KEY = "test/release"  # set by the test once it has every report but the stalled peers'


def expert_weights(expert: int, numel: int) -> torch.Tensor:
    """What every holder of `expert` has: deterministic per expert, different between experts."""
    generator = torch.Generator().manual_seed(1000 + expert)
    return torch.randn(numel, generator=generator, dtype=torch.float32)


def run_participant(
    backend: str,
    engine_id: str,
    participants: list[str],
    store_port: int,
    plan: list[TransferItem],
    held: list[int],
    numel: dict[int, int],
    timeout_s: float,
    results: Any,
    engines: list[str],
    absent_from_transfer: bool = False,
    broken_sources: bool = False,
) -> None:
    """Wait until every process of `engines` runs, open the channel, run the plan once, and put a report
    on `results`. With `absent_from_transfer` the engine opens the channel but never joins the transfer
    (a stalled peer) and keeps it open until the test sets `RELEASE_KEY`; with `broken_sources` it
    offers non-contiguous tensors, which it cannot serve."""
    report: dict[str, Any] = {"engine": engine_id, "failed_in": "start"}
    if backend == "nixl":
        # Small chunks over three reader threads: the tests' experts (up to 1 MiB) are cut in pieces
        # that land from different UCX workers, as big experts do in production.
        NixlChannel.CHUNK_BYTES = 100_000
        os.environ["EPCTL_NIXL_READ_THREADS"] = "3"
    started = time.monotonic()
    try:
        store = dist.TCPStore(
            "127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=HARNESS_TIMEOUT_S)
        )
        # Nobody opens before every process runs: the channel's deadlines then measure the channel,
        # not how long a loaded host takes to spawn a process and import torch.
        store.set(f"{STARTED_PREFIX}{engine_id}", "1")
        store.wait([f"{STARTED_PREFIX}{e}" for e in engines], timedelta(seconds=HARNESS_TIMEOUT_S))
        prefix_store = dist.PrefixStore("gen1/transfer", store)
        report["failed_in"] = "open"
        channel = open_channel(
            TransferBackend(backend),
            engine_id=engine_id,
            participants=participants,
            store=prefix_store,
            device=torch.device("cpu"),
            # A stalled peer is not what is timed: it must not give up on a slow reader either.
            timeout_s=HARNESS_TIMEOUT_S if absent_from_transfer else timeout_s,
        )
        report["failed_in"] = "transfer"
        try:
            if absent_from_transfer:
                store.wait([RELEASE_KEY], timedelta(seconds=HARNESS_TIMEOUT_S))  # stalled, its end open
                report["failed_in"] = None
                results.put(report)
                return
            # One buffer per engine with every expert as a view of it, as an engine's weight slab.
            sources = {e: expert_weights(e, numel[e]) for e in held}
            if broken_sources:
                sources = {e: torch.stack([t, t], dim=1)[:, 0] for e, t in sources.items()}
            wanted = [i.logical_expert for i in plan if i.dst == engine_id and i.src is not None]
            slab = torch.zeros(sum(numel[e] for e in wanted), dtype=torch.float32)
            destinations, offset = {}, 0
            for expert in wanted:
                destinations[expert] = slab[offset : offset + numel[expert]]
                offset += numel[expert]
            progress: list[int] = []
            stats = channel.transfer(plan, sources, destinations, on_progress=progress.append)
            report["exact"] = {
                e: bool(torch.equal(t, expert_weights(e, numel[e]))) for e, t in destinations.items()
            }
            report["stats"] = (stats.backend.value, stats.bytes_received, stats.bytes_sent)
            report["progress"] = progress
            report["failed_in"] = None
        finally:
            channel.close()
    except Exception as error:
        report["error_type"] = type(error).__name__
        report["error"] = str(error)
        report["is_timeout"] = isinstance(error, TimeoutError)
        report["traceback"] = traceback.format_exc()
    report["seconds"] = time.monotonic() - started
    results.put(report)
