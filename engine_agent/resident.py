"""The weights of the generation that broke under this engine, kept until a new generation serves.

When a peer dies the survivors leave their group at once and go idle, but the expert rows they served
from are still in memory. A self-heal shrink re-forms the group on the survivors: the coordinator reads
these rows from `/v1/info` (`AgentInfo.resident`) and plans the new placement from them, and a joining
engine stages every expert it holds here by a local copy, not from the checkpoint or the network.
The rows are dropped once this engine serves a new generation (its staged buffers are copies), so at
most one generation's weights are held twice, and only between a break and the next switch.

A warm spare (issue 38) holds every expert of every layer here before it ever joins (`hold_all`, asked
by the coordinator through `POST /v1/spare`): the job that makes it a member copies its rows from these
buffers (bytes `resident`), nothing from the checkpoint or the network. Its cost: every expert's
weights once (`num_moe_layers x num_logical_experts x expert_nbytes`), dropped when it serves.
"""

from __future__ import annotations

import threading

import torch

from engine_agent import moe
from engine_agent.protocol import EngineConfig, ResidentRows
from engine_agent.serving import ActiveGeneration


class ResidentWeights:
    """The last broken generation's rows: its placement, this engine's rank in it and its weights."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: ActiveGeneration | None = None
        self._rank = 0
        self._spare: dict[int, torch.Tensor] = {}  # a warm spare's copy of every expert

    def keep(self, broken: ActiveGeneration) -> None:
        """`broken` left the engine (its group failed): keep what it held."""
        rank = broken.rank  # read once: the group is being torn down
        with self._lock:
            self._held, self._rank = broken, rank

    def drop(self) -> None:
        """A new generation serves: its own buffers hold what it needs."""
        with self._lock:
            self._held = None
            self._spare = {}

    def hold_all(self, config: EngineConfig, device: torch.device) -> int:
        """A warm spare: load every expert of every layer (once; again is a no-op). The bytes held."""
        total = config.num_logical_experts * config.num_moe_layers
        with self._lock:
            if len(self._spare) == total:
                return self.spare_bytes()
        loaded = {expert: moe.expert_weights(config, expert, device) for expert in range(total)}
        with self._lock:
            self._spare = loaded
        return self.spare_bytes()

    def spare_bytes(self) -> int:
        """What a warm spare holds (0: not a spare, or it serves now)."""
        spare = self._spare
        return sum(t.numel() * t.element_size() for t in spare.values())

    def weights(self) -> dict[int, torch.Tensor]:
        """flat expert id (`moe.flat_id`) -> the buffer held; empty when nothing is kept. A broken
        generation's rows win over a spare's copies (the same weights either way)."""
        with self._lock:
            held = dict(self._held.weights) if self._held is not None else {}
            return {**self._spare, **held}

    def rows(self) -> ResidentRows | None:
        """What `/v1/info` reports: the broken generation's placement and this engine's rank in it."""
        with self._lock:
            held, rank = self._held, self._rank
        if held is None:
            return None
        return ResidentRows(
            generation=held.generation,
            rank=rank,
            placements=[[list(slots) for slots in layer] for layer in held.placements],
        )
