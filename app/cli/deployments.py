"""`epctl deployments list|show|create|update|delete` (and `agent-key` and the vLLM server's commands,
from `app.cli.deployment_engines`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.cli.client import (
    DEFAULT_URL,
    JsonOption,
    TokenOption,
    UrlOption,
    api_errors,
    command_group,
    connect,
    print_json,
    stdout,
    table,
)
from app.cli.deployment_engines import agent_key, engine, reconcile_engine, restart_engine
from app.cli.deployment_options import (
    LaunchTimeoutOption,
    MaxDowntimeOption,
    PauseOption,
    PeriodDownOption,
    PeriodUpOption,
    RayOption,
    SparesOption,
    StepDownOption,
    StepUpOption,
    StrategyOption,
    WarmupOption,
    WindowDownOption,
    WindowUpOption,
    behavior_update,
    parse_key_values,
    ray_settings,
)
from app.cli.deployment_view import COLUMNS, LIST_PAGE_SIZE, deployment_rows, show_deployment

app = command_group("Deployments: one EP group of engines, its size limits and policies.")


@app.command("list")
def list_deployments(
    url: UrlOption = DEFAULT_URL, token: TokenOption = None, as_json: JsonOption = False
) -> None:
    """List deployments (every page)."""
    data: list[dict[str, Any]] = []
    with api_errors(), connect(url, token) as api:
        params: dict[str, Any] = {"limit": LIST_PAGE_SIZE}
        while True:
            page = api.get("/v1/deployments", **params)
            data += page.get("data", [])
            if not page.get("next_cursor"):
                break
            params["cursor"] = page["next_cursor"]
    if as_json:
        print_json({"data": data, "count": len(data)})
        return
    if not data:
        stdout.print("No deployments.")
        return
    stdout.print(table(None, COLUMNS, deployment_rows(data)))


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one deployment."""
    with api_errors(), connect(url, token) as api:
        deployment = api.get(f"/v1/deployments/{name}")
    if as_json:
        print_json(deployment)
    else:
        show_deployment(deployment)


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="Deployment name (a DNS-label style slug).")],
    min_dp_size: Annotated[int, typer.Option("--min", help="Smallest DP size allowed.")] = 1,
    max_dp_size: Annotated[int, typer.Option("--max", help="Largest DP size allowed.")] = 8,
    launcher: Annotated[str, typer.Option("--launcher", help="local | static | ray")] = "local",
    warmup_policy: WarmupOption = None,
    strategy: StrategyOption = None,
    max_downtime_ms: MaxDowntimeOption = None,
    spares: SparesOption = None,
    launch_timeout_s: LaunchTimeoutOption = None,
    pause: Annotated[
        bool, typer.Option("--pause-autoscaling", help="Start with autoscaler-initiated jobs stopped.")
    ] = False,
    up_window: WindowUpOption = None,
    down_window: WindowDownOption = None,
    up_step: StepUpOption = None,
    down_step: StepDownOption = None,
    up_period: PeriodUpOption = None,
    down_period: PeriodDownOption = None,
    ray_option: RayOption = None,
    engine_option: Annotated[
        list[str] | None,
        typer.Option("--engine", help="Engine config KEY=VALUE (e.g. num_logical_experts=16); repeatable."),
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="reference | vllm")] = "reference",
    vllm_url: Annotated[str | None, typer.Option("--vllm-url", help="vllm: the API server's URL.")] = None,
    vllm_api_key: Annotated[
        str | None,
        typer.Option(
            "--vllm-api-key", envvar="EPCTL_VLLM_API_KEY", help="vllm: its API key (or the env var)."
        ),
    ] = None,
    vllm_model: Annotated[
        str | None, typer.Option("--vllm-model", help="vllm, launcher local: the model to serve.")
    ] = None,
    drain_timeout_s: Annotated[
        int | None, typer.Option("--drain-timeout", help="vllm: seconds to drain requests before a scale.")
    ] = None,
    serve_arg: Annotated[
        list[str] | None, typer.Option("--serve-arg", help="vllm, launcher local: a server flag; repeatable.")
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a deployment (admin)."""
    body: dict[str, Any] = {
        "name": name,
        "min_dp_size": min_dp_size,
        "max_dp_size": max_dp_size,
        "launcher": launcher,
        "backend": backend,
    }
    if backend == "vllm":
        vllm: dict[str, Any] = {"url": vllm_url, "api_key": vllm_api_key, "model": vllm_model}
        if drain_timeout_s is not None:
            vllm["drain_timeout_s"] = drain_timeout_s
        if serve_arg:
            vllm["serve_args"] = serve_arg
        body["vllm"] = {k: v for k, v in vllm.items() if v is not None}
    if warmup_policy:
        body["warmup_policy"] = warmup_policy
    if strategy:
        body["strategy"] = strategy
    if max_downtime_ms is not None:
        body["max_downtime_ms"] = max_downtime_ms
    if spares is not None:
        body["spares"] = spares
    if launch_timeout_s is not None:
        body["launch_timeout_s"] = launch_timeout_s
    if pause:
        body["autoscale_paused"] = True
    behavior = behavior_update(
        up_window=up_window,
        down_window=down_window,
        up_step=up_step,
        down_step=down_step,
        up_period=up_period,
        down_period=down_period,
    )
    if behavior:
        body["autoscale_behavior"] = behavior
    if engine_option:
        body["engine"] = parse_key_values(engine_option)
    if ray_option:
        body["ray"] = ray_settings({}, ray_option)
    with api_errors(), connect(url, token) as api:
        deployment = api.post("/v1/deployments", body)
    if as_json:
        print_json(deployment)
    else:
        stdout.print(f"Created deployment [bold]{deployment.get('name')}[/].")
        show_deployment(deployment)


@app.command("update")
def update(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    min_dp_size: Annotated[int | None, typer.Option("--min", help="Smallest DP size allowed.")] = None,
    max_dp_size: Annotated[int | None, typer.Option("--max", help="Largest DP size allowed.")] = None,
    warmup_policy: WarmupOption = None,
    strategy: StrategyOption = None,
    cooldown_s: Annotated[
        float | None, typer.Option("--autoscale-cooldown", help="Seconds between autoscaler requests.")
    ] = None,
    max_downtime_ms: MaxDowntimeOption = None,
    no_max_downtime: Annotated[
        bool, typer.Option("--no-max-downtime", help="Turn the downtime budget off.")
    ] = False,
    spares: SparesOption = None,
    launch_timeout_s: LaunchTimeoutOption = None,
    no_launch_timeout: Annotated[
        bool, typer.Option("--no-launch-timeout", help="Make the launch timeout adaptive again.")
    ] = False,
    pause: PauseOption = None,
    up_window: WindowUpOption = None,
    down_window: WindowDownOption = None,
    up_step: StepUpOption = None,
    down_step: StepDownOption = None,
    up_period: PeriodUpOption = None,
    down_period: PeriodDownOption = None,
    ray_option: RayOption = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a deployment's limits, policies or Ray settings (admin). Only the options given change."""
    body: dict[str, Any] = {
        key: value
        for key, value in {
            "min_dp_size": min_dp_size,
            "max_dp_size": max_dp_size,
            "warmup_policy": warmup_policy,
            "strategy": strategy,
            "autoscale_cooldown_s": cooldown_s,
            "max_downtime_ms": max_downtime_ms,
            "autoscale_paused": pause,
            "spares": spares,
            "launch_timeout_s": launch_timeout_s,
            "autoscale_behavior": behavior_update(
                up_window=up_window,
                down_window=down_window,
                up_step=up_step,
                down_step=down_step,
                up_period=up_period,
                down_period=down_period,
            ),
        }.items()
        if value is not None
    }
    if no_max_downtime:
        if max_downtime_ms is not None:
            raise typer.BadParameter("give --max-downtime-ms or --no-max-downtime, not both")
        body["max_downtime_ms"] = None  # an explicit null: the API turns the budget off
    if no_launch_timeout:
        if launch_timeout_s is not None:
            raise typer.BadParameter("give --launch-timeout or --no-launch-timeout, not both")
        body["launch_timeout_s"] = None  # an explicit null: adaptive again
    if not body and not ray_option:
        raise typer.BadParameter(
            "give at least one of --min, --max, --warmup-policy, --strategy, --autoscale-cooldown, "
            "--max-downtime-ms, --no-max-downtime, --spares, --launch-timeout, --no-launch-timeout, "
            "--pause-autoscaling, --resume-autoscaling, "
            "--scale-{up,down}-{window,max-step,period}, --ray"
        )
    with api_errors(), connect(url, token) as api:
        if ray_option:
            current = api.get(f"/v1/deployments/{name}").get("ray") or {}
            body["ray"] = ray_settings(current, ray_option)
        deployment = api.patch(f"/v1/deployments/{name}", body)
    if as_json:
        print_json(deployment)
    else:
        stdout.print(f"Updated deployment [bold]{name}[/].")
        show_deployment(deployment)


@app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete a deployment (admin; only when no job is active)."""
    if not yes:
        typer.confirm(f"Delete deployment {name}?", abort=True)
    with api_errors(), connect(url, token) as api:
        api.delete(f"/v1/deployments/{name}")
    if as_json:
        print_json({"deleted": name})
    else:
        stdout.print(f"Deleted deployment [bold]{name}[/].")


app.command("agent-key")(agent_key)
app.command("engine")(engine)
app.command("reconcile-engine")(reconcile_engine)
app.command("restart-engine")(restart_engine)
