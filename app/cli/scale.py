"""`epctl scale DEPLOYMENT N [--policy] [--strategy] [--commit] [--max-downtime-ms] [--reason] [--retire ...]
[--wait]`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.cli.client import (
    CLI_SOURCE,
    DEFAULT_URL,
    JsonOption,
    TokenOption,
    UrlOption,
    api_errors,
    connect,
    print_json,
    stdout,
    styled_state,
)
from app.cli.jobs import TimeoutOption, watch_job


def scale(
    deployment: Annotated[str, typer.Argument(help="Deployment name.")],
    target_dp_size: Annotated[int, typer.Argument(help="The DP size to reach.", min=1)],
    policy: Annotated[
        str | None, typer.Option("--policy", help="Warm-up policy for this job: auto | eager | deferred.")
    ] = None,
    strategy: Annotated[str | None, typer.Option("--strategy", help="background | blocking")] = None,
    commit: Annotated[
        str | None,
        typer.Option("--commit", help="Who picks the switch boundary: engines (default) | coordinator."),
    ] = None,
    max_downtime_ms: Annotated[
        int | None,
        typer.Option(
            "--max-downtime-ms",
            help="Downtime budget for this job (default: the deployment's); over it, the job rolls back.",
        ),
    ] = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (kept with the job).")] = None,
    retire: Annotated[
        list[str] | None,
        typer.Option(
            "--retire",
            help="Scale-down: this engine leaves (once per engine leaving); default: the highest ranks.",
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Send this Idempotency-Key (safe retries).")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Follow the job live to its end; exit 1 unless it succeeded.")
    ] = False,
    timeout: TimeoutOption = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Request a reconfiguration of DEPLOYMENT to N engines."""
    body: dict[str, Any] = {"deployment": deployment, "target_dp_size": target_dp_size, "source": CLI_SOURCE}
    if policy:
        body["warmup_policy"] = policy
    if strategy:
        body["strategy"] = strategy
    if commit:
        body["commit"] = commit
    if max_downtime_ms is not None:  # 0 or less goes too: the API's 422 names the bound
        body["max_downtime_ms"] = max_downtime_ms
    if reason:
        body["reason"] = reason
    if retire:
        body["retire"] = list(retire)
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    with api_errors(), connect(url, token) as api:
        job = api.post("/v1/reconfigurations", body, headers=headers)
    job_id = job["id"]
    if not wait:
        if as_json:
            print_json(job)
        else:
            stdout.print(
                f"Reconfiguration [bold]{job_id}[/] {styled_state(job.get('state'))}: "
                f"{deployment} {job.get('from_dp_size')} -> {job.get('to_dp_size')}"
            )
            stdout.print(f"[dim]follow it: epctl jobs watch {job_id}[/]")
        return
    if not as_json:
        stdout.print(
            f"Reconfiguration [bold]{job_id}[/]: {deployment} "
            f"{job.get('from_dp_size')} -> {job.get('to_dp_size')}"
        )
    watch_job(job_id, url=url, token=token, as_json=as_json, timeout_s=timeout)
