"""Real agents running a model of two MoE layers, each with its own router, experts, load counters and
placement: per-layer placements planned from the previous ones survive 2 -> 3 -> 2 with reference-exact
outputs (the way down retires the middle engine), with the experts of a layer run one at a time or
batched."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from engine_agent import moe
from engine_agent.layer_placement import rebalance_layers
from engine_agent.protocol import PrepareRequest
from tests.agent.driver import SMALL, AgentProcess, Driver, JobOutcome, assert_serves_reference, random_tokens

pytestmark = pytest.mark.processes

LAYERED = SMALL.model_copy(update={"num_moe_layers": 2})
Spawn = Callable[..., list[AgentProcess]]


@dataclass
class LayeredDriver(Driver):
    """The test driver, planning every layer from the previous placement as the coordinator does."""

    config: Any = field(default_factory=lambda: LAYERED.model_copy())
    placements: list[list[list[int]]] = field(default_factory=list)
    last: PrepareRequest | None = None

    def prepare_request(self, new_members: list[AgentProcess], **options: Any) -> PrepareRequest:
        request = super().prepare_request(new_members, **options)
        layers = self.config.num_moe_layers
        load = [[0] * self.config.num_logical_experts for _ in range(layers)]
        for agent in self.members:
            for layer, counts in enumerate(agent.info().layer_expert_load):
                load[layer] = [a + b for a, b in zip(load[layer], counts, strict=True)]
        old = {a.engine_id: rank for rank, a in enumerate(self.members)}
        plan = rebalance_layers(
            load,
            self.config.num_redundant_experts,
            len(new_members),
            previous=self.placements or None,
            origin=[old.get(a.engine_id) for a in new_members] if self.placements else None,
            num_logical=self.config.num_logical_experts,
        )
        placements = plan.to_lists()
        self.last = request.model_copy(
            update={"placement": placements[0], "placements": placements, "old_placements": self.placements}
        )
        return self.last

    def reconfigure(self, new_members: list[AgentProcess], **options: Any) -> JobOutcome:
        outcome = super().reconfigure(new_members, **options)
        assert self.last is not None
        self.placements = self.last.placements
        return outcome


def serve_some(agents: list[AgentProcess]) -> None:
    """Traffic, so that each layer counts its own expert load."""
    for agent in agents:
        for _ in range(3):
            assert agent.infer(random_tokens(LAYERED, 8)).status_code == 200


# `on`: each layer's experts in two batched matmuls over its stack, the path a GPU takes by default;
# the CPU's default (`auto`) loops over them.
@pytest.mark.parametrize("grouped_step", ["auto", "on"])
def test_two_layer_placements_survive_2_to_3_to_2_with_exact_outputs(
    spawn_agents: Spawn, grouped_step: str
) -> None:
    agents = spawn_agents(
        3, config=LAYERED, extra_args=("--enable-fault-injection", "--grouped-step", grouped_step)
    )
    driver = LayeredDriver()
    driver.reconfigure(agents[:2])
    assert_serves_reference(agents[:2], config=LAYERED)
    serve_some(agents[:2])
    loads = agents[0].info().layer_expert_load
    assert len(loads) == 2 and loads[0] != loads[1], "each layer routes on its own"

    driver.reconfigure(agents)
    assert_serves_reference(agents, config=LAYERED)
    serve_some(agents)
    info = agents[2].info()
    assert info.placements == driver.placements and len(info.placements) == 2

    driver.reconfigure([agents[0], agents[2]])  # the middle engine leaves
    assert_serves_reference([agents[0], agents[2]], config=LAYERED)
    assert agents[2].info().rank == 1 and agents[2].info().placements == driver.placements


def test_the_reference_chains_layers_and_one_layer_is_the_old_single_layer_model() -> None:
    tokens = random_tokens(LAYERED, 4)
    one = moe.reference_forward(SMALL, tokens)
    two = moe.reference_forward(LAYERED, tokens)
    assert not torch.allclose(one, two)
    assert moe.flat_id(LAYERED, 1, 3) == LAYERED.num_logical_experts + 3
