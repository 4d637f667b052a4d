"""The agent's command line as the local and Ray launchers write it, byte for byte, over a spread of
engine configs: the engine's options are derived from `EngineConfig`'s fields (one definition), and the
lines stay what they were when every launcher listed the options by hand. The agent's options (the same
`add_engine_options` its parser calls) read each one back into the same config."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

import pytest

from app.launchers.base import LaunchSpec
from app.launchers.local import agent_command
from app.launchers.ray_launcher import agent_args
from app.launchers.ray_settings import RaySettings
from engine_agent.engine_options import add_engine_options, engine_args
from engine_agent.protocol import EngineConfig
from engine_agent.settings import AgentSettings

# (config, coordinator URL, the deployment's extra arguments, the engine's options as written before)
CASES = {
    "defaults": (
        EngineConfig(),
        None,
        (),
        "--num-logical-experts 16 --num-redundant-experts 0 --hidden-size 64 --intermediate-size 128 "
        "--top-k 2 --dtype float32 --seed 0",
    ),
    "small, registered": (
        EngineConfig(num_logical_experts=8, hidden_size=32),
        "http://127.0.0.1:8000",
        ("--enable-fault-injection",),
        "--num-logical-experts 8 --num-redundant-experts 0 --hidden-size 32 --intermediate-size 128 "
        "--top-k 2 --dtype float32 --seed 0",
    ),
    "every field set": (
        EngineConfig(
            num_logical_experts=64,
            num_redundant_experts=8,
            hidden_size=1024,
            intermediate_size=2048,
            top_k=8,
            dtype="bfloat16",
            seed=42,
            num_moe_layers=4,
        ),
        "http://10.0.0.1:8000",
        (),
        "--num-logical-experts 64 --num-redundant-experts 8 --hidden-size 1024 --intermediate-size 2048 "
        "--top-k 8 --dtype bfloat16 --seed 42 --num-moe-layers 4",
    ),
    "half precision, one layer": (
        EngineConfig(dtype="float16", seed=7, num_moe_layers=1, top_k=1),
        None,
        ("--log-level", "info", "--grouped-step", "on"),
        "--num-logical-experts 16 --num-redundant-experts 0 --hidden-size 64 --intermediate-size 128 "
        "--top-k 1 --dtype float16 --seed 7",
    ),
    "deepest": (
        EngineConfig(num_logical_experts=2, num_moe_layers=256, intermediate_size=1),
        "http://coordinator:8000",
        ("--log-format", "json"),
        "--num-logical-experts 2 --num-redundant-experts 0 --hidden-size 64 --intermediate-size 1 "
        "--top-k 2 --dtype float32 --seed 0 --num-moe-layers 256",
    ),
}


def spec_of(case: str) -> LaunchSpec:
    engine, url, extra, _ = CASES[case]
    return LaunchSpec(
        deployment="demo", engine=engine, coordinator_url=url, token="epctl_secret", extra_args=extra
    )


def tail_of(case: str) -> str:
    """Where to register (when the spec names a coordinator), then the deployment's extra arguments."""
    _, url, extra, _ = CASES[case]
    registration = f" --coordinator {url} --deployment demo" if url else ""
    return registration + "".join(f" {arg}" for arg in extra)


@pytest.mark.parametrize("case", CASES)
def test_the_local_launcher_writes_the_command_line_it_always_wrote(case: str) -> None:
    ready_file = Path("/state/demo-0.ready")
    command = agent_command(spec_of(case), "demo-0", ready_file, ["epctl-agent"], orphan_grace_s=15.0)
    assert shlex.join(command) == (
        "epctl-agent --host 127.0.0.1 --port 0 --ready-file /state/demo-0.ready --engine-id demo-0 "
        f"{CASES[case][3]} --parent-pid {os.getpid()} --orphan-grace-s 15.0{tail_of(case)}"
    )


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    ("settings", "platform"), [(RaySettings(), "cpu"), (RaySettings(num_gpus=1), "cuda")]
)
def test_the_ray_launcher_writes_the_arguments_it_always_wrote(
    case: str, settings: RaySettings, platform: str
) -> None:
    assert shlex.join(agent_args(spec_of(case), settings)) == (
        f"{CASES[case][3]} --platform {platform}{tail_of(case)}"
    )


@pytest.mark.parametrize("case", CASES)
def test_the_agent_reads_the_engine_options_back_into_the_same_config(case: str) -> None:
    engine = CASES[case][0]
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    parsed = AgentSettings.from_options(parser.parse_args(engine_args(engine)))
    assert parsed.engine_config() == engine
