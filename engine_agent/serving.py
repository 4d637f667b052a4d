"""The narrow interface between the reconfiguration executor and a serving engine (`ServingEngine`:
pause at a step boundary, switch groups, placement, weights and step graphs together, resume, leave,
submit, expert load, free KV bytes) and the types it passes. `engine_agent.engine`'s reference engine
implements it; a production engine can be plugged in behind the same interface.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine_agent.groups import CommGroup
from engine_agent.moe import ExpertStack, LayerView
from engine_agent.protocol import AgentState, StoreAddress
from engine_agent.step_graphs import StepGraphs


class EngineUnavailable(RuntimeError):
    """The engine cannot serve this request (in no generation, left, or not admitting): HTTP 503."""


@dataclass
class ActiveGeneration:
    """Everything one generation's serving needs, switched as one piece."""

    generation: int
    group: CommGroup
    members: list[str]
    placements: list[list[list[int]]]  # per MoE layer
    weights: dict[int, torch.Tensor]  # flat expert id (moe.flat_id) -> packed buffer held by this rank
    member_urls: list[str] = field(default_factory=list)  # agents' URLs by rank: who to tell it broke
    member_data: list[StoreAddress | None] = field(default_factory=list)  # their data addresses, by rank
    stacks: dict[int, ExpertStack] = field(default_factory=dict)  # layer -> the stack `weights` views
    graphs: StepGraphs | None = None  # the step's CUDA graphs, captured for this generation

    @property
    def placement(self) -> list[list[int]]:
        """Layer 0's placement."""
        return self.placements[0]

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.size


@dataclass
class InferResult:
    outputs: torch.Tensor
    generation: int
    rank: int
    step: int


@dataclass
class PausedAt:
    wall: float  # epoch seconds
    monotonic: float
    boundary_wait_ms: float
    by_peer: bool  # stopped by another member's pause request before ours arrived
    armed: bool = False  # stopped at the boundary every member was armed for (engine-agreed commit)


@dataclass
class ArmedSwitch:
    """The new generation handed to `arm` ahead of the boundary: the serving thread switches to it at
    the agreed boundary and steps on at once, with no hand-off to another thread inside the window.
    The engine fills in the rest when it has switched."""

    new: ActiveGeneration
    views: list[LayerView] | None = None
    paused: PausedAt | None = None  # the boundary (armed), when taken
    retired: ActiveGeneration | None = None
    switched_monotonic: float = 0.0  # the new generation installed (its first iteration follows)


class ServingEngine(Protocol):
    """What the reconfiguration executor needs from an engine."""

    @property
    def state(self) -> AgentState: ...
    @property
    def active(self) -> ActiveGeneration | None: ...
    def submit(self, tokens: torch.Tensor) -> Future[InferResult]: ...
    def set_admitting(self, admitting: bool) -> None: ...
    def set_drain_before_pause(self, drain: bool) -> None: ...
    def pause(self, timeout_s: float) -> PausedAt: ...
    def arm(self, generation: int, switch: ArmedSwitch | None = None) -> None: ...
    def wait_armed_boundary(self, timeout_s: float, withdraw_s: float) -> PausedAt | None: ...
    def withdraw_arm(self, timeout_s: float) -> bool: ...
    def resume(self) -> None: ...
    def abandon(self, generation: int, reason: str) -> bool: ...
    def views_for(
        self,
        placements: list[list[list[int]]],
        weights: dict[int, torch.Tensor],
        *,
        rank: int,
        stacks: dict[int, ExpertStack],
    ) -> list[LayerView]: ...
    @property
    def captures_graphs(self) -> bool: ...
    def capture_graphs(self, views: list[LayerView], *, rank: int) -> StepGraphs | None: ...
    def switch(
        self, new: ActiveGeneration, views: list[LayerView] | None = None
    ) -> ActiveGeneration | None: ...
    def leave(self, *, fail_queued: bool) -> ActiveGeneration | None: ...
    def wait_serving(self, timeout_s: float) -> bool: ...
    def serving_since(self) -> float | None: ...
    def expert_load(self) -> list[int]: ...
    def layer_expert_load(self) -> list[list[int]]: ...
    def free_kv_bytes(self) -> int: ...
    def stop(self) -> None: ...
