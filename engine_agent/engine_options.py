"""`EngineConfig` on a command line, derived from the model's fields: the agent's options
(`add_engine_options`, read back by `AgentSettings.from_options`) and the arguments a launcher passes
(`engine_args`). A new field of `protocol.EngineConfig` is one edit: its option, its `EPCTL_AGENT_*`
variable (`AgentSettings` inherits the fields) and every launcher's command line follow.

Torch-free: the coordinator's launchers import it.
"""

from __future__ import annotations

import argparse
from typing import Any, Literal, get_args, get_origin

from engine_agent.protocol import EngineConfig

# Passed only when they differ from the default, so that the command line of an engine that does not
# use them stays the one it was before they existed.
SENT_WHEN_SET = frozenset({"num_moe_layers", "cuda_graphs", "cuda_graph_buckets"})


def option(name: str) -> str:
    """`num_moe_layers` -> `--num-moe-layers`."""
    return "--" + name.replace("_", "-")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """One option per field: its type (or its choices, for a `Literal`), default and description."""
    for name, field in EngineConfig.model_fields.items():
        kind = field.annotation
        if get_origin(kind) is Literal:
            form: dict[str, Any] = {"choices": list(get_args(kind))}
        elif kind in (int, float, str):
            form = {"type": kind}
        elif kind == list[int]:
            form = {"type": _int_list}
        else:
            raise TypeError(f"EngineConfig.{name}: no command-line form for {kind}")
        default = field.get_default(call_default_factory=True)
        parser.add_argument(option(name), **form, default=default, help=field.description)


def _int_list(text: str) -> list[int]:
    """`1,2,4` -> [1, 2, 4] (a list field on the command line is comma-separated)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from exc


def engine_args(engine: EngineConfig) -> list[str]:
    """The engine's shape as the agent's options, in the model's field order."""
    args: list[str] = []
    for name, field in EngineConfig.model_fields.items():
        value = getattr(engine, name)
        if name in SENT_WHEN_SET and value == field.get_default(call_default_factory=True):
            continue
        args += [option(name), ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return args
