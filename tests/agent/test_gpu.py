"""The NCCL path on real GPUs: agents on platform cuda run their generation's groups as
ProcessGroupNCCL, expert weights and the step math on the device. Skipped without CUDA.

One GPU allows a 1-engine generation (NCCL world 1) and a rebuild of it on the same engine; a NCCL
communicator cannot hold two ranks on one GPU, so scaling between engines needs one GPU per engine
(the second test runs when two or more are visible)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine_agent.protocol import AgentState, ReconfigPhase, WarmupPolicy
from tests.agent.driver import AgentProcess, Driver, assert_serves_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

Spawn = Callable[..., list[AgentProcess]]


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
