"""`epctl deployments list|show|create|update|delete`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.cli.client import (
    DEFAULT_URL,
    JsonOption,
    TokenOption,
    UrlOption,
    api_errors,
    connect,
    print_json,
    short_time,
    stdout,
    table,
)

app = typer.Typer(help="Deployments: one EP group of engines, its size limits and policies.",
                  no_args_is_help=True)

WarmupOption = Annotated[
    str | None, typer.Option("--warmup-policy", help="auto | eager | deferred")
]
StrategyOption = Annotated[str | None, typer.Option("--strategy", help="background | blocking")]


def _deployment_rows(deployments: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            d.get("name"),
            d.get("current_dp_size"),
            f"{d.get('min_dp_size')}..{d.get('max_dp_size')}",
            d.get("generation"),
            d.get("status"),
            d.get("warmup_policy"),
            d.get("strategy"),
            d.get("launcher"),
            d.get("active_job_id"),
        ]
        for d in deployments
    ]


_COLUMNS = ["NAME", "DP size", "LIMITS", "GEN", "STATUS", "WARM-UP", "STRATEGY", "LAUNCHER", "ACTIVE JOB"]


def show_deployment(deployment: dict[str, Any]) -> None:
    stdout.print(table(None, _COLUMNS, _deployment_rows([deployment])))
    engine = deployment.get("engine") or {}
    if engine:
        layout = ", ".join(f"{k}={v}" for k, v in engine.items())
        stdout.print(f"\nengine: {layout}")
    stdout.print(f"id: {deployment.get('id')}   created: {short_time(deployment.get('created_at'))}")


@app.command("list")
def list_deployments(
    url: UrlOption = DEFAULT_URL, token: TokenOption = None, as_json: JsonOption = False
) -> None:
    """List deployments."""
    with api_errors(), connect(url, token) as api:
        result = api.get("/v1/deployments")
    if as_json:
        print_json(result)
        return
    data = result.get("data", [])
    if not data:
        stdout.print("No deployments.")
        return
    stdout.print(table(None, _COLUMNS, _deployment_rows(data)))


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
    launcher: Annotated[str, typer.Option("--launcher", help="local | static")] = "local",
    warmup_policy: WarmupOption = None,
    strategy: StrategyOption = None,
    engine_option: Annotated[
        list[str] | None,
        typer.Option("--engine", help="Engine config KEY=VALUE (e.g. num_logical_experts=16); repeatable."),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a deployment (admin)."""
    body: dict[str, Any] = {"name": name, "min_dp_size": min_dp_size, "max_dp_size": max_dp_size,
                            "launcher": launcher}
    if warmup_policy:
        body["warmup_policy"] = warmup_policy
    if strategy:
        body["strategy"] = strategy
    if engine_option:
        body["engine"] = _parse_key_values(engine_option)
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
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a deployment's limits or policies (admin). Only the options given change."""
    body: dict[str, Any] = {
        key: value
        for key, value in {
            "min_dp_size": min_dp_size,
            "max_dp_size": max_dp_size,
            "warmup_policy": warmup_policy,
            "strategy": strategy,
            "autoscale_cooldown_s": cooldown_s,
        }.items()
        if value is not None
    }
    if not body:
        raise typer.BadParameter("give at least one of --min, --max, --warmup-policy, --strategy, "
                                 "--autoscale-cooldown")
    with api_errors(), connect(url, token) as api:
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


def _parse_key_values(pairs: list[str]) -> dict[str, Any]:
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
