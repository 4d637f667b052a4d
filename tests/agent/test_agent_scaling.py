"""Real agent processes on loopback, driven through their HTTP API like the coordinator does: forming
a generation and scaling it, with reference-exact outputs after every step and requests served while
prepare runs."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from engine_agent import moe
from engine_agent.protocol import (
    AgentState,
    ReconfigPhase,
    Strategy,
    TransferBackend,
    WarmupPolicy,
)
from tests.agent.driver import (
    REL_TOL,
    SMALL,
    AgentProcess,
    Driver,
    assert_serves_reference,
    random_tokens,
    relative_error,
)

pytestmark = pytest.mark.processes

Spawn = Callable[..., list[AgentProcess]]


def serves_while_prepare_is_held(
    old: list[AgentProcess], held: AgentProcess, step: str
) -> Callable[[], None]:
    """A during_prepare hook: with `held` stopped at a prepare step (fault injection), the old generation
    answers correctly and the job is demonstrably still in prepare; then let prepare go on."""

    def check() -> None:
        Driver().wait_step(held, step)
        assert_serves_reference(old)
        assert held.status().phase == ReconfigPhase.preparing
        held.faults(release_hang=True)

    return check


class SteadyClient:
    """Sends requests to the given agents in a loop while a job runs; every answer must be correct."""

    def __init__(self, agents: list[AgentProcess]) -> None:
        self.agents = agents
        self.errors: list[str] = []
        self.served = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SteadyClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            for agent in self.agents:
                tokens = random_tokens(SMALL, 3)
                response = agent.infer(tokens)
                if response.status_code != 200:
                    self.errors.append(f"{agent.engine_id}: {response.status_code} {response.text}")
                    continue
                error = relative_error(
                    torch.tensor(response.json()["outputs"]), moe.reference_forward(SMALL, tokens)
                )
                if error >= REL_TOL:
                    self.errors.append(f"{agent.engine_id}: relative error {error}")
                self.served += 1


def test_formation_from_zero_engines_serves_reference_outputs(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    assert all(a.infer(random_tokens(SMALL, 2)).status_code == 503 for a in agents)  # idle before formation
    driver = Driver()
    outcome = driver.reconfigure(agents)
    assert {s.role for s in outcome.statuses.values()} == {"joining"}
    # Every expert from the checkpoint, none from a peer: no weight channel was opened.
    assert {s.transfer_backend for s in outcome.statuses.values()} == {None}
    infos = [a.info() for a in agents]
    assert [i.state for i in infos] == [AgentState.serving, AgentState.serving]
    assert [(i.generation, i.rank, i.world_size) for i in infos] == [(1, 0, 2), (1, 1, 2)]
    assert infos[0].placement == infos[1].placement == driver.placement
    assert_serves_reference(agents)


def test_scale_up_2_to_3_serves_during_prepare_and_after(spawn_agents: Spawn) -> None:
    agents = spawn_agents(3)
    driver = Driver()
    driver.reconfigure(agents[:2])
    assert_serves_reference(agents[:2])
    agents[2].faults(hang_prepare_at_step="open_channel")
    with SteadyClient(agents[:2]) as client:
        outcome = driver.reconfigure(
            agents, during_prepare=serves_while_prepare_is_held(agents[:2], agents[2], "open_channel")
        )
    assert client.errors == [] and client.served > 0
    assert {e: s.role for e, s in outcome.statuses.items()} == {
        "e0": "staying",
        "e1": "staying",
        "e2": "joining",
    }
    status = outcome.statuses["e2"]
    assert status.bytes_moved == status.bytes_total > 0
    assert status.transfer_backend is not None  # the joiner's experts came from its peers
    assert all(s.synced_value and s.synced_value > 0 for s in outcome.statuses.values())
    assert len({s.synced_value for s in outcome.statuses.values()}) == 1
    assert [a.info().world_size for a in agents] == [3, 3, 3]
    assert_serves_reference(agents)
    load = [sum(x) for x in zip(*(a.info().expert_load for a in agents), strict=True)]
    assert sum(load) > 0


def test_scale_down_3_to_2_leaver_goes_idle_and_the_rest_serve(spawn_agents: Spawn) -> None:
    agents = spawn_agents(3)
    driver = Driver()
    driver.reconfigure(agents)
    assert_serves_reference(agents)
    agents[0].faults(hang_prepare_at_step="transfer")
    with SteadyClient(agents[:2]) as client:
        outcome = driver.reconfigure(
            agents[:2], during_prepare=serves_while_prepare_is_held(agents[:2], agents[0], "transfer")
        )
    assert client.errors == [] and client.served > 0
    assert outcome.statuses["e2"].role == "leaving"
    assert_serves_reference(agents[:2])
    leaver = agents[2].info()
    assert leaver.state == AgentState.idle and leaver.rank is None
    assert agents[2].infer(random_tokens(SMALL, 1)).status_code == 503
    assert agents[2].get("/v1/cleanup").json()["recent"][0]["ok"]


def test_2_to_4_to_2_keeps_outputs_exact_at_every_step(spawn_agents: Spawn) -> None:
    agents = spawn_agents(4)
    driver = Driver()
    driver.reconfigure(agents[:2])
    assert_serves_reference(agents[:2])
    driver.reconfigure(agents)
    assert_serves_reference(agents)
    outcome = driver.reconfigure(agents[2:])  # the original two leave
    assert {e: s.role for e, s in outcome.statuses.items()}["e0"] == "leaving"
    assert_serves_reference(agents[2:])
    assert [a.info().state for a in agents] == [
        AgentState.idle,
        AgentState.idle,
        AgentState.serving,
        AgentState.serving,
    ]


def test_blocking_strategy_does_prepare_inside_the_pause(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents[:1])
    outcome = driver.reconfigure(agents, strategy=Strategy.blocking)
    assert {s.strategy for s in outcome.statuses.values()} == {Strategy.blocking}
    pause = outcome.statuses["e0"].pause
    assert pause is not None and pause.blocking_prepare_ms > 0
    assert pause.pause_ms is not None and pause.pause_ms >= pause.blocking_prepare_ms
    assert outcome.statuses["e1"].pause is None  # a joiner is never down
    assert outcome.statuses["e1"].bytes_moved == outcome.statuses["e1"].bytes_total > 0
    assert_serves_reference(agents)


def test_deferred_policy_warms_up_inside_the_window(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents[:1], policy="deferred")
    outcome = driver.reconfigure(agents, policy="deferred")
    assert {s.warmup_policy for s in outcome.statuses.values()} == {WarmupPolicy.deferred}
    pause = outcome.statuses["e0"].pause
    assert pause is not None and pause.warmup_ms > 0
    assert_serves_reference(agents)


def test_weights_move_over_nixl_when_every_engine_has_it(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    if any(TransferBackend.nixl not in a.info().transfer_backends for a in agents):
        pytest.skip("NIXL with UCX is not available here")
    driver = Driver()
    driver.reconfigure(agents[:1], backend=TransferBackend.nixl)
    outcome = driver.reconfigure(agents, backend=TransferBackend.nixl)
    assert {s.transfer_backend for s in outcome.statuses.values()} == {TransferBackend.nixl}
    joiner = outcome.statuses["e1"]
    assert joiner.bytes_moved == joiner.bytes_total > 0  # read from e0 over NIXL
    assert_serves_reference(agents)
