"""`epctl deployments agent-key|engine|reconcile-engine|restart-engine`: a deployment's agent key, and
a vLLM deployment's server (registered on the `deployments` group by `app.cli.deployments`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.cli.client import (
    DEFAULT_URL,
    Coordinator,
    JsonOption,
    TokenOption,
    UrlOption,
    api_errors,
    connect,
    print_json,
    stdout,
)


def agent_key(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    rotate: Annotated[
        bool,
        typer.Option(
            "--rotate",
            help="Make a new key, tell the live agents, restart those that refuse the coordinator's key "
            "(local, Ray), print it.",
        ),
    ] = False,
    overlap_s: Annotated[
        float | None,
        typer.Option(
            "--overlap-s",
            help="With --rotate: how long the previous key stays valid, 10 s to 7 days (default 3600); "
            "then it opens nothing anywhere.",
        ),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print the deployment's agent key, once (admin): static agents need it as EPCTL_AGENT_KEY. With
    --rotate, a new one, and what could not be told it: engines that refuse the coordinator's key are
    restarted by their launcher (local, Ray), static agents named for their operator to restart."""
    with api_errors(), connect(url, token) as api:
        if rotate:
            body = {"overlap_s": overlap_s} if overlap_s is not None else None
            view = api.post(f"/v1/deployments/{name}/agent-key/rotate", body)
        else:
            view = api.post(f"/v1/deployments/{name}/agent-key")
    if as_json:
        print_json(view)
        return
    print(view["key"])  # alone on stdout: `export EPCTL_AGENT_KEY=$(epctl deployments agent-key NAME)`
    if view.get("previous_valid_until"):
        typer.echo(f"the previous key stays valid until {view['previous_valid_until']}, then never", err=True)
    if view.get("pushed_to"):
        typer.echo(f"told: {', '.join(view['pushed_to'])}", err=True)
    restarted, by_operator = view.get("restarted") or [], view.get("restart_by_operator") or []
    for engine_id, why in (view.get("not_pushed") or {}).items():
        if engine_id not in restarted and engine_id not in by_operator:
            typer.echo(
                f"NOT told (it keeps the previous key until the overlap ends): {engine_id}: {why}", err=True
            )
    if restarted:
        typer.echo(
            f"refused the coordinator's key, stopped by their launcher (self-healing replaces them with "
            f"engines that hold the new key): {', '.join(restarted)}",
            err=True,
        )
    for engine_id in by_operator:
        typer.echo(
            f"refuses the coordinator's key, a static agent: restart it with EPCTL_AGENT_KEY set to the new "
            f"key: {engine_id}",
            err=True,
        )


def engine(
    name: Annotated[str, typer.Argument(help="Deployment name (backend vllm).")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """A vLLM deployment's server as it answers now, beside the record."""
    with api_errors(), connect(url, token) as api:
        view = api.get(f"/v1/deployments/{name}/engine")
    _print_engine(view, as_json)


def reconcile_engine(
    name: Annotated[str, typer.Argument(help="Deployment name (backend vllm).")],
    dp_size: Annotated[int | None, typer.Option("--dp-size", help="State the server's DP size.")] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Bring the record in line with the vLLM server (operator): ready when it serves."""
    with api_errors(), connect(url, token) as api:
        view = api.post(f"/v1/deployments/{name}/engine/reconcile", {"dp_size": dp_size} if dp_size else None)
    _print_engine(view, as_json)


def restart_engine(
    name: Annotated[str, typer.Argument(help="Deployment name (backend vllm, launcher local).")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Restart the vLLM server the local launcher runs for a deployment (operator); waits until ready."""
    with api_errors(), Coordinator(url=url or DEFAULT_URL, token=token or None, timeout_s=900.0) as api:
        view = api.post(f"/v1/deployments/{name}/engine/restart")
    _print_engine(view, as_json)


def _print_engine(view: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(view)
        return
    if not view.get("reachable"):
        state = f"[red]unreachable[/] ({view.get('error')})"
    elif view.get("scaling"):
        state = "[yellow]scaling[/]"
    else:
        state = (
            "[green]serving[/]" if view.get("healthy") else f"[red]unhealthy[/] ({view.get('health_status')})"
        )
    stdout.print(f"[bold]{view.get('deployment')}[/]: vLLM at {view.get('url') or '-'} {state}")
    stdout.print(
        f"DP size {view.get('current_dp_size')} (record); metrics show {view.get('metrics_engines')} "
        f"engine(s), expected {view.get('expected_metrics_engines')}; status {view.get('status')}"
    )
    detail = view.get("status_detail")
    if detail:
        stdout.print(f"  {detail.get('reason')}: {detail.get('message')}")
        if detail.get("hint"):
            stdout.print(f"  [yellow]hint:[/] {detail['hint']}")
    for note in view.get("notes") or []:
        stdout.print(f"  [dim]{note}[/]")
    if view.get("server_pid"):
        stdout.print(f"  local server pid {view['server_pid']}, log {view.get('server_log')}")
