"""The engine-agreed commit switched by the serving thread itself (`serving.ArmedSwitch`): armed with
the new generation built ahead, the engine installs it at the agreed boundary and steps on, with no
`switch` call from another thread; the window ends at its first step, stamped by the serving thread.
In-process: world-1 gloo groups, no agent processes (the multi-process commit is in
`test_engine_commit.py`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from engine_agent import groups, moe
from engine_agent.engine import ReferenceEngine
from engine_agent.protocol import AgentState, EngineConfig, Platform
from engine_agent.serving import ActiveGeneration, ArmedSwitch

CONFIG = EngineConfig(
    num_logical_experts=8, num_redundant_experts=2, hidden_size=16, intermediate_size=24, top_k=3,
    num_moe_layers=2,
)  # fmt: skip
PLACEMENTS = {1: [[0, 1, 2, 3, 4, 5, 6, 7, 0, 3]], 2: [[7, 6, 5, 4, 3, 2, 1, 0, 1, 2]]}


def generation(
    engine: ReferenceEngine, store: torch.distributed.Store, number: int
) -> tuple[ActiveGeneration, list[moe.LayerView]]:
    group = groups.create_group(
        name="ep", generation=number, store=groups.prefixed(store, f"g{number}/"), rank=0, size=1,
        platform=Platform.cpu, device=torch.device("cpu"), timeout_s=10.0,
    )  # fmt: skip
    placement = PLACEMENTS[number]
    wanted = {layer: sorted(set(placement[0])) for layer in range(CONFIG.num_moe_layers)}
    weights, stacks = moe.stack_buffers(CONFIG, wanted, "cpu")
    for expert, view in weights.items():
        view.copy_(moe.expert_weights(CONFIG, expert))
    views = engine.views_for([placement] * 2, weights, rank=0, stacks=stacks)
    new = ActiveGeneration(
        generation=number, group=group, members=["e0"], placements=[placement] * 2, weights=weights,
        stacks=stacks,
    )  # fmt: skip
    return new, views


@contextlib.contextmanager
def serving_with_next() -> Iterator[tuple[ReferenceEngine, ActiveGeneration, ArmedSwitch]]:
    """An engine serving generation 1, and generation 2 built ahead as an `ArmedSwitch` (not yet armed)."""
    store = groups.start_store_server("127.0.0.1", 10.0)
    engine = ReferenceEngine(CONFIG, torch.device("cpu"), grouped_step=True)
    old, old_views = generation(engine, store, 1)
    engine.switch(old, views=old_views)
    new: ActiveGeneration | None = None
    try:
        new, views = generation(engine, store, 2)
        yield engine, old, ArmedSwitch(new, views=views)
    finally:
        engine.stop()
        if new is not None:
            groups.destroy_group(new.group)
        groups.destroy_group(old.group)


def test_armed_with_the_new_generation_the_serving_thread_switches_at_the_boundary_itself() -> None:
    with serving_with_next() as (engine, old, armed):
        assert engine.wait_serving(10.0)
        new = armed.new
        engine.arm(2, armed)
        paused = engine.wait_armed_boundary(10.0, withdraw_s=5.0)
        assert paused is not None and paused.armed and paused is armed.paused
        # Nobody called `switch`: the loop installed the new generation and serves it.
        assert armed.retired is old and engine.active is new
        assert engine.wait_serving(10.0) and engine.state == AgentState.serving
        since = engine.serving_since()
        assert since is not None and since >= armed.switched_monotonic >= paused.monotonic
        tokens = torch.randn(5, CONFIG.hidden_size)
        result = engine.submit(tokens).result(timeout=30)
        assert result.generation == 2
        reference = moe.reference_forward(CONFIG, tokens)
        assert float((result.outputs - reference).norm() / reference.norm()) < 1e-5


def test_an_arm_withdrawn_after_the_boundary_says_the_switch_happened() -> None:
    with serving_with_next() as (engine, _old, armed):
        engine.arm(2, armed)
        assert engine.wait_armed_boundary(10.0, withdraw_s=5.0) is not None
        assert not engine.withdraw_arm(5.0)  # the boundary was taken: the caller must not roll back
