"""The options `epctl deployments create|update` share, and what they turn into (autoscaling behaviour,
Ray settings)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

WarmupOption = Annotated[str | None, typer.Option("--warmup-policy", help="auto | eager | deferred")]
StrategyOption = Annotated[str | None, typer.Option("--strategy", help="background | blocking")]
MaxDowntimeOption = Annotated[
    int | None,
    typer.Option(
        "--max-downtime-ms", help="Downtime budget: a commit window that would run longer rolls back."
    ),
]
LaunchTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--launch-timeout",
        help="Seconds a launch waits for its engines to be ready (an engine that exits fails it at once); "
        "default: adaptive, from the launches the coordinator saw.",
    ),
]
SparesOption = Annotated[
    int | None,
    typer.Option(
        "--spares",
        help="Warm spares to keep beyond the size: launched, holding every expert, taken first by self-heal "
        "and grows (reference backend, launcher local or ray; 0: none).",
    ),
]
PauseOption = Annotated[
    bool | None,
    typer.Option(
        "--pause-autoscaling/--resume-autoscaling",
        help="Stop (or resume) autoscaler-initiated jobs; operator jobs and self-healing still run.",
    ),
]
WindowUpOption = Annotated[
    float | None,
    typer.Option("--scale-up-window", help="Seconds every ask must agree before a scale-up (default 0)."),
]
WindowDownOption = Annotated[
    float | None,
    typer.Option(
        "--scale-down-window", help="Seconds every ask must agree before a scale-down (default 300)."
    ),
]
StepUpOption = Annotated[
    int | None,
    typer.Option("--scale-up-max-step", help="Most engines autoscalers add per period (0: no limit)."),
]
StepDownOption = Annotated[
    int | None,
    typer.Option("--scale-down-max-step", help="Most engines autoscalers remove per period (0: no limit)."),
]
PeriodUpOption = Annotated[
    float | None, typer.Option("--scale-up-period", help="Seconds the scale-up max step counts over (60).")
]
PeriodDownOption = Annotated[
    float | None,
    typer.Option("--scale-down-period", help="Seconds the scale-down max step counts over (60)."),
]
RayOption = Annotated[
    list[str] | None,
    typer.Option(
        "--ray",
        help="Ray setting KEY=VALUE for launcher ray (address, namespace, num_cpus, num_gpus, memory_mb, "
        "placement_strategy, placement_timeout_s, agent_host; dotted for maps: resources.NAME=N, "
        "runtime_env.env_vars.NAME=V, runtime_env.working_dir=DIR); repeatable.",
    ),
]


def behavior_update(
    *,
    up_window: float | None,
    down_window: float | None,
    up_step: int | None,
    down_step: int | None,
    up_period: float | None,
    down_period: float | None,
) -> dict[str, Any] | None:
    """The `autoscale_behavior` fields the options give (a max step of 0 removes the limit)."""
    behavior: dict[str, dict[str, Any]] = {}
    for direction, window, step, period in (
        ("scale_up", up_window, up_step, up_period),
        ("scale_down", down_window, down_step, down_period),
    ):
        rules: dict[str, Any] = {}
        if window is not None:
            rules["stabilization_window_s"] = window
        if step is not None:
            rules["max_step"] = step or None
        if period is not None:
            rules["period_s"] = period
        if rules:
            behavior[direction] = rules
    return behavior or None


def ray_settings(current: dict[str, Any], pairs: list[str]) -> dict[str, Any]:
    """`current` Ray settings with KEY=VALUE pairs applied; dotted keys reach into maps
    (`resources.accel=1`, `runtime_env.env_vars.X=y`). Values are numbers where they parse as such,
    except environment variables, which stay strings."""
    settings: dict[str, Any] = {k: v for k, v in current.items() if v is not None}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}")
        path = key.strip().split(".")
        target = settings
        for part in path[:-1]:
            child = target.get(part)
            if not isinstance(child, dict):
                child = {}
                target[part] = child
            target = child
        in_env = path[:-1] == ["runtime_env", "env_vars"]
        target[path[-1]] = raw if in_env else parse_key_values([f"x={raw}"])["x"]
    return settings


def parse_key_values(pairs: list[str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}")
        value: Any = raw
        for convert in (int, float):
            try:
                value = convert(raw)
                break
            except ValueError:
                continue
        parsed[key.strip()] = value
    return parsed
