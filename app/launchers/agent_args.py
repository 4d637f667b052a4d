"""The `epctl-agent` arguments every launcher reads from a deployment's settings: the engine's shape (from
`EngineConfig`'s fields: `engine_agent.engine_options`), where the agent registers, and the operator's
extra arguments. Each launcher adds its own (host, port, ready file, platform...); the bearer token never
travels here but in the environment (`EPCTL_TOKEN`), since any local user can read a command line in
/proc or `ps`."""

from __future__ import annotations

from collections.abc import Sequence

from app.launchers.base import LaunchSpec
from engine_agent.engine_options import engine_args


def deployment_agent_args(spec: LaunchSpec, launcher_args: Sequence[str] = ()) -> list[str]:
    """The engine's shape, then `launcher_args`, then where to register (when the spec names a
    coordinator), then the deployment's extra arguments, last."""
    args = [*engine_args(spec.engine), *launcher_args]
    if spec.coordinator_url:
        args += ["--coordinator", spec.coordinator_url, "--deployment", spec.deployment]
    return args + list(spec.extra_args)
