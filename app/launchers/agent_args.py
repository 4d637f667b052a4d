"""The `epctl-agent` arguments every launcher reads from a deployment's settings: the engine's shape, where
the agent registers, and the operator's extra arguments. Each launcher adds its own (host, port, ready
file, platform...); the bearer token never travels here but in the environment (`EPCTL_TOKEN`), since any
local user can read a command line in /proc or `ps`."""

from __future__ import annotations

from collections.abc import Sequence

from app.launchers.base import LaunchSpec
from engine_agent.protocol import DEFAULT_GRAPH_BUCKETS, EngineConfig


def engine_args(engine: EngineConfig) -> list[str]:
    """The engine's shape as the agent's options."""
    args = [
        "--num-logical-experts",
        str(engine.num_logical_experts),
        "--num-redundant-experts",
        str(engine.num_redundant_experts),
        "--hidden-size",
        str(engine.hidden_size),
        "--intermediate-size",
        str(engine.intermediate_size),
        "--top-k",
        str(engine.top_k),
        "--dtype",
        engine.dtype,
        "--seed",
        str(engine.seed),
    ]
    if engine.num_moe_layers > 1:
        args += ["--num-moe-layers", str(engine.num_moe_layers)]
    if engine.cuda_graphs != "auto":
        args += ["--cuda-graphs", engine.cuda_graphs]
    if engine.cuda_graph_buckets != list(DEFAULT_GRAPH_BUCKETS):
        args += ["--cuda-graph-buckets", ",".join(map(str, engine.cuda_graph_buckets))]
    return args


def deployment_agent_args(spec: LaunchSpec, launcher_args: Sequence[str] = ()) -> list[str]:
    """The engine's shape, then `launcher_args`, then where to register (when the spec names a
    coordinator), then the deployment's extra arguments, last."""
    args = [*engine_args(spec.engine), *launcher_args]
    if spec.coordinator_url:
        args += ["--coordinator", spec.coordinator_url, "--deployment", spec.deployment]
    return args + list(spec.extra_args)
