"""`epctl deployments list|show|create|update|delete`."""

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
    command_group,
    connect,
    print_json,
    short_time,
    stdout,
    table,
)

app = command_group("Deployments: one EP group of engines, its size limits and policies.")

WarmupOption = Annotated[str | None, typer.Option("--warmup-policy", help="auto | eager | deferred")]
StrategyOption = Annotated[str | None, typer.Option("--strategy", help="background | blocking")]
MaxDowntimeOption = Annotated[
    int | None,
    typer.Option(
        "--max-downtime-ms", help="Downtime budget: a commit window that would run longer rolls back."
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


def _rules_text(rules: dict[str, Any]) -> str:
    step = rules.get("max_step")
    limit = f"at most {step} per {rules.get('period_s'):g} s" if step else "no step limit"
    return f"window {rules.get('stabilization_window_s'):g} s, {limit}"


def _deployment_rows(deployments: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            d.get("name"),
            d.get("current_dp_size"),
            _desired_cell(d.get("desired") or {}),
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


def _desired_cell(desired: dict[str, Any]) -> str:
    """`5 (pending: cooldown)` while an autoscaler's request waits, `5` once acted on, `-` if none."""
    if desired.get("dp_size") is None:
        return "-"
    if desired.get("pending"):
        return f"{desired['dp_size']} (pending: {desired.get('blocked_by') or 'next tick'})"
    return str(desired["dp_size"])


LIST_PAGE_SIZE = 200  # the API's largest page

_COLUMNS = [
    "NAME",
    "DP size",
    "DESIRED",
    "LIMITS",
    "GEN",
    "STATUS",
    "WARM-UP",
    "STRATEGY",
    "LAUNCHER",
    "ACTIVE JOB",
]


def show_deployment(deployment: dict[str, Any]) -> None:
    stdout.print(table(None, _COLUMNS, _deployment_rows([deployment])))
    vllm = deployment.get("vllm")
    engine = deployment.get("engine") or {}
    if vllm:
        key = "set" if vllm.get("api_key_set") else "none"
        stdout.print(
            f"\nbackend: vllm at {vllm.get('url') or '(not started)'}  api key: {key}  "
            f"drain timeout: {vllm.get('drain_timeout_s')} s"
            + (f"  model: {vllm['model']}" if vllm.get("model") else "")
        )
    elif engine:
        layout = ", ".join(f"{k}={v}" for k, v in engine.items())
        stdout.print(f"\nengine: {layout}")
    desired = deployment.get("desired") or {}
    if desired.get("dp_size") is not None:
        stdout.print(
            f"desired: {desired['dp_size']} from {desired.get('source')}"
            + (f" ({desired['requester']})" if desired.get("requester") else "")
            + f" at {desired.get('requested_at')}: {desired.get('reason')}"
            + (
                f"  [yellow]pending ({desired.get('blocked_by') or 'next tick'})[/]"
                if desired.get("pending")
                else ""
            )
        )
    if desired.get("next_scale_at"):
        stdout.print(f"next autoscaler move possible at: {desired['next_scale_at']}")
    behavior = deployment.get("autoscale_behavior") or {}
    if behavior:
        state = "[yellow]paused[/]" if deployment.get("autoscale_paused") else "active"
        up, down = _rules_text(behavior.get("scale_up") or {}), _rules_text(behavior.get("scale_down") or {})
        cooldown = deployment.get("autoscale_cooldown_s") or 0
        stdout.print(f"autoscaling: {state}; cooldown {cooldown:g} s; scale up: {up}; scale down: {down}")
    for intent in desired.get("standing") or []:
        job = f", job {intent['job_id']}" if intent.get("job_id") else ""
        stdout.print(
            f"  intent {intent['id']}: {intent['target_dp_size']} from {intent['source']} "
            f"({intent['state']}{job}) since {short_time(intent.get('since'))}: {intent.get('reason')}"
        )
    detail = deployment.get("status_detail")
    if detail:
        stdout.print(
            f"[bold yellow]{deployment.get('status')}[/] ({detail.get('reason')}): {detail.get('message')}"
        )
        if detail.get("hint"):
            stdout.print(f"  [yellow]hint:[/] {detail['hint']}")
    if deployment.get("max_downtime_ms") is not None:
        stdout.print(f"downtime budget: {deployment['max_downtime_ms']} ms")
    ray = deployment.get("ray")
    if ray:
        shown = ", ".join(f"{k}={v}" for k, v in ray.items() if v not in (None, {}, []))
        stdout.print(f"ray: {shown}")
    stdout.print(f"id: {deployment.get('id')}   created: {short_time(deployment.get('created_at'))}")


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
    launcher: Annotated[str, typer.Option("--launcher", help="local | static | ray")] = "local",
    warmup_policy: WarmupOption = None,
    strategy: StrategyOption = None,
    max_downtime_ms: MaxDowntimeOption = None,
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
        body["engine"] = _parse_key_values(engine_option)
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
    if not body and not ray_option:
        raise typer.BadParameter(
            "give at least one of --min, --max, --warmup-policy, --strategy, --autoscale-cooldown, "
            "--max-downtime-ms, --no-max-downtime, --pause-autoscaling, --resume-autoscaling, "
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


@app.command("agent-key")
def agent_key(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    rotate: Annotated[
        bool, typer.Option("--rotate", help="Make a new key, tell the live agents, print it.")
    ] = False,
    overlap_s: Annotated[
        float | None,
        typer.Option(
            "--overlap-s", help="With --rotate: how long the previous key stays valid (default 3600)."
        ),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print the deployment's agent key, once (admin): static agents need it as EPCTL_AGENT_KEY."""
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
        typer.echo(f"the previous key stays valid until {view['previous_valid_until']}", err=True)
    if view.get("pushed_to"):
        typer.echo(f"told: {', '.join(view['pushed_to'])}", err=True)
    for engine_id, why in (view.get("not_pushed") or {}).items():
        typer.echo(f"NOT told (restart it with the new key): {engine_id}: {why}", err=True)


@app.command("engine")
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


@app.command("reconcile-engine")
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


@app.command("restart-engine")
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
        target[path[-1]] = raw if in_env else _parse_key_values([f"x={raw}"])["x"]
    return settings


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
