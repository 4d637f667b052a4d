"""How `epctl deployments list|show` print a deployment."""

from __future__ import annotations

from typing import Any

from app.cli.client import short_time, stdout, table


def _rules_text(rules: dict[str, Any]) -> str:
    """The window and the rate limits as HPA names them: `max_step`'s and the policies, chosen by
    `select_policy` (none at all: HPA's defaults)."""
    limits = [f"{rules['max_step']} per {rules.get('period_s'):g} s"] if rules.get("max_step") else []
    limits += [
        f"{p.get('value')}{' %' if p.get('type') == 'Percent' else ''} per {p.get('period_s'):g} s"
        for p in rules.get("policies") or []
    ]
    select = rules.get("select_policy") or "Max"
    if select == "Disabled":
        limit = "disabled (select_policy Disabled)"
    elif not limits:
        limit = "HPA's default rate"
    else:
        limit = ("at most " if len(limits) == 1 else f"{select} of ") + ", ".join(limits)
    return f"window {rules.get('stabilization_window_s'):g} s, {limit}"


def deployment_rows(deployments: list[dict[str, Any]]) -> list[list[Any]]:
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

COLUMNS = [
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
    stdout.print(table(None, COLUMNS, deployment_rows([deployment])))
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
    if deployment.get("spares"):
        held = deployment.get("spare_engines") or []
        stdout.print(
            f"warm spares: {len(held)} of {deployment['spares']}" + (f" ({', '.join(held)})" if held else "")
        )
    if deployment.get("max_downtime_ms") is not None:
        stdout.print(f"downtime budget: {deployment['max_downtime_ms']} ms")
    if deployment.get("launch_timeout_s") is not None:
        stdout.print(f"launch timeout: {deployment['launch_timeout_s']:g} s")
    ray = deployment.get("ray")
    if ray:
        shown = ", ".join(f"{k}={v}" for k, v in ray.items() if v not in (None, {}, []))
        stdout.print(f"ray: {shown}")
    stdout.print(f"id: {deployment.get('id')}   created: {short_time(deployment.get('created_at'))}")
