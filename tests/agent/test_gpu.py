"""The NCCL path on real GPUs: agents on platform cuda run their generation's groups as
ProcessGroupNCCL, expert weights and the step math on the device, the step captured as CUDA graphs
(one per token-count bucket) for each new generation. Skipped without CUDA.

One GPU allows a 1-engine generation (NCCL world 1) and a rebuild of it on the same engine; a NCCL
communicator cannot hold two ranks on one GPU, so scaling between engines needs one GPU per engine
(the last test runs when two or more are visible)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine_agent.protocol import AgentState, ReconfigPhase, WarmupPolicy
from tests.agent.driver import (
    SMALL,
    AgentProcess,
    Driver,
    assert_serves_reference,
    random_tokens,
    relative_error,
)
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

Spawn = Callable[..., list[AgentProcess]]

# bf16, where the step's grouped matmul runs on Hopper; few buckets, so each capture is short.
GRAPHED = SMALL.model_copy(update={"dtype": "bfloat16", "cuda_graph_buckets": [1, 4, 16]})
BF16_TOL = 2e-2  # bf16 experts against the CPU's bf16 reference: accumulation order differs
# A placement other than the formation's: the rebuilt generation's graphs see other rows and tables.
REVERSED = [[*reversed(range(SMALL.num_logical_experts)), 0, 1]]


def graphed_agent(spawn: Spawn, graphs: str = "on", first: int = 0) -> AgentProcess:
    config = GRAPHED.model_copy(update={"cuda_graphs": graphs})
    (agent,) = spawn(1, first=first, platform="cuda", device="cuda:0", config=config)
    return agent


def test_one_gpu_engine_forms_serves_and_rebuilds_its_generation(spawn_agents: Spawn) -> None:
    (agent,) = spawn_agents(1, platform="cuda", device="cuda:0")
    info = agent.info()
    assert (info.platform, info.device, info.state) == ("cuda", "cuda:0", AgentState.idle)
    driver = Driver()
    driver.reconfigure([agent], policy=WarmupPolicy.eager)  # formation: NCCL world 1
    assert_serves_reference([agent])
    outcome = driver.reconfigure([agent], policy=WarmupPolicy.deferred)  # 1 -> 1, warm-up in the window
    status = outcome.statuses["e0"]
    assert status.phase == ReconfigPhase.committed and status.role == "staying"
    assert status.pause is not None and status.pause.warmup_ms > 0
    assert status.synced_value is not None and status.synced_value > 0  # free device memory
    assert agent.info().generation == 2
    assert_serves_reference([agent])
    cleanup = agent.get("/v1/cleanup").json()
    assert cleanup["state"] in ("idle", "running")


def test_graphs_captured_in_prepare_are_replayed_after_a_rebuild_with_a_new_placement(
    spawn_agents: Spawn,
) -> None:
    agent = graphed_agent(spawn_agents)
    eager = graphed_agent(spawn_agents, graphs="off", first=1)  # the same engine without graphs
    driver, eager_driver = Driver(config=GRAPHED), Driver(config=GRAPHED)
    eager_driver.reconfigure([eager])
    formed = driver.reconfigure([agent], policy=WarmupPolicy.eager).statuses["e0"]
    assert formed.graphs is not None and not formed.graphs.in_window and formed.graphs.graphs == 3
    served_meanwhile: list[int] = []
    driver.plan = lambda new_members: REVERSED  # type: ignore[method-assign]
    eager_driver.plan = lambda new_members: REVERSED  # type: ignore[method-assign]

    def serve_while_capturing() -> None:  # the old generation serves while prepare captures
        served_meanwhile.append(agent.infer(random_tokens(GRAPHED, 4)).status_code)

    rebuilt = driver.reconfigure([agent], policy=WarmupPolicy.eager, during_prepare=serve_while_capturing)
    eager_driver.reconfigure([eager])
    status = rebuilt.statuses["e0"]
    assert status.graphs is not None and not status.graphs.in_window and status.graphs.capture_ms > 0
    assert status.pause is not None and status.pause.capture_ms == 0.0  # nothing captured in the window
    assert served_meanwhile == [200]
    before = agent.info().graph_steps
    for count in (1, 3, 16, 40):  # 40: past the largest bucket, eager
        tokens = random_tokens(GRAPHED, count)
        replayed = torch.tensor(agent.infer(tokens).json()["outputs"])
        plain = torch.tensor(eager.infer(tokens).json()["outputs"])
        assert relative_error(replayed, plain) < 1e-2, count
    info = agent.info()
    assert info.graph_steps - before == 3 and info.placement == REVERSED
    assert_serves_reference([agent, eager], GRAPHED, rel_tol=BF16_TOL)


def test_deferred_capture_runs_inside_the_window_after_the_pause(spawn_agents: Spawn) -> None:
    agent = graphed_agent(spawn_agents)
    driver = Driver(config=GRAPHED)
    driver.reconfigure([agent], policy=WarmupPolicy.deferred)
    status = driver.reconfigure([agent], policy=WarmupPolicy.deferred).statuses["e0"]
    assert status.graphs is not None and status.graphs.in_window
    assert status.pause is not None and status.pause.warmup_ms > 0 and status.pause.capture_ms > 0
    assert status.pause.pause_ms is not None and status.pause.pause_ms >= status.pause.capture_ms
    assert_serves_reference([agent], GRAPHED, rel_tol=BF16_TOL)
    assert agent.info().graph_steps > 0


def test_retired_graphs_are_released_by_the_cleanup_and_their_memory_comes_back(
    spawn_agents: Spawn,
) -> None:
    agent = graphed_agent(spawn_agents)
    driver = Driver(config=GRAPHED)
    driver.reconfigure([agent])
    assert_serves_reference([agent], GRAPHED, rel_tol=BF16_TOL)
    serving = agent.info()
    assert serving.cuda_graphs is not None and serving.device_memory is not None
    retired_bytes = serving.cuda_graphs.graph_bytes
    assert retired_bytes > 0
    driver.reconfigure([agent])

    def released() -> bool:
        cleanup = agent.info().cleanup
        return cleanup.state == "idle" and bool(cleanup.recent) and cleanup.recent[0].generation == 1

    wait_until(released, timeout_s=30, what="the retired generation's cleanup")
    after = agent.info()
    assert after.cleanup.recent[0].graph_bytes_released == retired_bytes
    assert after.device_memory is not None
    # The new generation holds what the retired one held: no graph pool of the old one is left over.
    grown = after.device_memory.allocated_bytes - serving.device_memory.allocated_bytes
    assert abs(grown) < retired_bytes / 2, (grown, retired_bytes)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="scaling between engines needs one GPU per engine")
def test_two_gpu_engines_scale_1_to_2_to_1(spawn_agents: Spawn) -> None:
    first = spawn_agents(1, platform="cuda", device="cuda:0")
    second = spawn_agents(1, first=1, platform="cuda", device="cuda:1")
    agents = first + second
    driver = Driver()
    driver.reconfigure(agents[:1])
    assert_serves_reference(agents[:1])
    driver.reconfigure(agents)
    assert_serves_reference(agents)
    driver.reconfigure(agents[1:])
    assert_serves_reference(agents[1:])
    assert agents[0].info().state == AgentState.idle
