"""The agent's command line a launcher builds from a deployment's engine config starts an agent that
runs that same config (the agent registers only with the config its deployment has)."""

from __future__ import annotations

import pytest

from app.launchers.agent_args import engine_args
from engine_agent.main import _parser
from engine_agent.protocol import EngineConfig
from engine_agent.settings import AgentSettings


@pytest.mark.parametrize(
    "engine",
    [
        EngineConfig(),
        EngineConfig(num_moe_layers=3, dtype="bfloat16", cuda_graphs="off"),
        EngineConfig(cuda_graphs="on", cuda_graph_buckets=[64, 1, 8]),
    ],
)
def test_the_agent_runs_the_engine_config_its_launcher_was_given(engine: EngineConfig) -> None:
    args = _parser().parse_args(["--platform", "cuda", *engine_args(engine)])
    assert AgentSettings.from_options(args, port=1).engine_config() == engine
