"""`epctl jobs list|show|watch|cancel` and `epctl cleanup retry|ack`."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer

from app.cli.client import (
    DEFAULT_URL,
    EXIT_JOB_UNSUCCESSFUL,
    Coordinator,
    CoordinatorError,
    DeploymentFilter,
    JsonOption,
    TokenOption,
    UrlOption,
    api_errors,
    command_group,
    connect,
    duration_ms,
    fail,
    fmt_ms,
    fmt_outage,
    print_json,
    short_time,
    stderr,
    stdout,
    styled_state,
    table,
)
from app.cli.job_summary import describe_failure, print_summary, self_heal_lines
from app.cli.watch import WatchTimeout, follow, job_path

app = command_group("Reconfiguration jobs: history, details, live progress, cancel.")
cleanup_app = command_group("Resolve a job's failed background cleanup.")

JobIdArgument = Annotated[str, typer.Argument(help="Job id (rcfg_...).")]
TimeoutOption = Annotated[
    float | None, typer.Option("--timeout", help="Give up waiting after this many seconds (exit 1).")
]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(value: str | None) -> str | None:
    """An ISO time (UTC unless it names its zone; the form epctl prints too), or an age like 30m / 2h /
    7d meaning that long ago; returned as ISO UTC."""
    if value is None:
        return None
    match = _RELATIVE.match(value.strip())
    if match:
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat()
    text = value.strip().removesuffix(" UTC")  # as epctl prints times: "2026-12-06 07:17:02 UTC"
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{value!r} is neither an ISO time nor an age like 30m, 2h, 7d") from None
    # Without a zone: UTC, the clock every time epctl prints is on.
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def job_rows(jobs: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            j.get("id"),
            j.get("deployment"),
            f"{j.get('from_dp_size')} -> {j.get('to_dp_size')}",
            styled_state(j.get("state")),
            j.get("requested_by"),
            short_time(j.get("created_at")),
            fmt_ms(duration_ms(j.get("created_at"), j.get("finished_at"))) if j.get("finished_at") else "-",
            fmt_ms(j.get("downtime_ms")) if j.get("downtime_ms") is not None else "-",
            fmt_outage(j),
        ]
        for j in jobs
    ]


# Downtime is the engines' own pause; the client outage is what the canaries saw (often longer: a
# prepare under load stalls clients without pausing anything), so both stand side by side.
JOB_COLUMNS = ["JOB", "DEPLOYMENT", "SIZE", "STATE", "SOURCE", "CREATED", "TOOK", "DOWNTIME", "CLIENT OUTAGE"]


@app.command("list")
def list_jobs(
    deployment: DeploymentFilter = None,
    state: Annotated[str | None, typer.Option("--state", "-s", help="Only jobs in this state.")] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--source",
            help="Only jobs requested by: api, cli, autoscaler, webhook, system, scale-subresource.",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Created after: ISO time (UTC unless zoned) or an age (30m, 2h, 7d)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Created before: ISO time (UTC unless zoned) or an age (30m, 2h, 7d)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=500, help="Jobs per page.")] = 20,
    cursor: Annotated[str | None, typer.Option("--cursor", help="Continue from a previous page.")] = None,
    all_pages: Annotated[bool, typer.Option("--all", help="Follow the cursor through every page.")] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List reconfiguration jobs, newest first."""
    params: dict[str, Any] = {
        "deployment": deployment,
        "state": state,
        "source": source,
        "created_after": parse_when(since),
        "created_before": parse_when(until),
        "limit": limit,
        "cursor": cursor,
    }
    jobs: list[dict[str, Any]] = []
    with api_errors(), connect(url, token) as api:
        while True:
            page = api.get("/v1/reconfigurations", **params)
            jobs.extend(page.get("data", []))
            next_cursor = page.get("next_cursor")
            if not (all_pages and next_cursor):
                break
            params["cursor"] = next_cursor
    if as_json:
        print_json(
            {
                "data": jobs,
                "count": page.get("count"),
                "count_exact": page.get("count_exact", True),
                "next_cursor": next_cursor,
            }
        )
        return
    if not jobs:
        stdout.print("No reconfigurations match.")
        return
    stdout.print(table(None, JOB_COLUMNS, job_rows(jobs)))
    total = page.get("count")
    bound = "" if page.get("count_exact", True) else "+"  # a capped count is a lower bound
    footer = f"{len(jobs)} shown" + (f" of {total}{bound}" if total is not None else "")
    if next_cursor:
        footer += f"; next page: --cursor {next_cursor}"
    stderr.print(f"[dim]{footer}[/]")


def probe_lines(job: dict[str, Any]) -> list[str]:
    """What the canary probe saw, beyond the summary's outage and slowest answer: rate and deadline,
    latency outside the outage, what prepare cost against before the job, and engines it could not
    reach."""
    probe = job.get("probe")
    if not isinstance(probe, dict) or probe.get("canaries_sent") is None:
        return []

    def ms(value: Any) -> str:
        return fmt_ms(value) if isinstance(value, int | float) else "-"

    outside = probe.get("latency_p50_ms_outside_outage", probe.get("latency_p50_ms_outside_downtime"))
    deadline = f", deadline {ms(probe['deadline_ms'])}" if probe.get("deadline_ms") is not None else ""
    lines = [
        f"[bold]probe:[/] {probe.get('canaries_sent', 0)} canaries to {probe.get('targets', 0)} engines "
        f"every {ms(probe.get('interval_ms'))}{deadline}, {probe.get('canaries_failed', 0)} failed; "
        f"p50 outside the outage {ms(outside)}"
    ]
    phases = probe.get("phases") or {}
    before, prepare = phases.get("before"), phases.get("prepare")
    if isinstance(before, dict) and isinstance(prepare, dict):
        lines.append(
            f"  [dim]prepare cost:[/] p99 {ms(prepare.get('p99_ms'))} (before {ms(before.get('p99_ms'))}), "
            f"slowest answer {ms(prepare.get('slowest_answer_ms'))} "
            f"(before {ms(before.get('slowest_answer_ms'))})"
        )
    unreachable = probe.get("unreachable") or {}
    if unreachable:
        named = ", ".join(f"{engine} ({why})" for engine, why in sorted(unreachable.items()))
        lines.append(f"  [yellow]probe could not reach:[/] {named}")
    return lines


@app.command("show")
def show(
    job_id: JobIdArgument,
    log: Annotated[bool, typer.Option("--log/--no-log", help="Print the transition log.")] = True,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one job: state, phases, engines, downtime, error, cleanup and its transition log."""
    with api_errors(), connect(url, token) as api:
        job = api.get(job_path(job_id))
        incident = _incident_of(api, job) if not as_json else None
    if as_json:
        print_json(job)
        return
    print_summary(job)
    for line in [*self_heal_lines(job, incident), *probe_lines(job)]:
        stdout.print(line)
    events = job.get("events") or []
    if log and events:
        rows = [
            [
                e.get("seq"),
                short_time(e.get("created_at")),
                e.get("kind"),
                f"{e.get('from_state') or ''} -> {e.get('to_state')}" if e.get("to_state") else "",
                e.get("message"),
            ]
            for e in events
        ]
        stdout.print(table("log", ["#", "TIME", "KIND", "TRANSITION", "MESSAGE"], rows))


def _incident_of(api: Coordinator, job: dict[str, Any]) -> dict[str, Any] | None:
    """The incident the job belongs to (the loss a self-heal job recovers from, or one that hit its
    generation right after it), or None; a job's page still prints when the incident cannot be read."""
    incident_id = job.get("incident_id")
    try:
        if incident_id:
            found = api.get(f"/v1/incidents/{incident_id}")
            return found if isinstance(found, dict) else None
        if job.get("requested_by") != "self-heal":
            return None
        # Recorded before self-heal jobs named their incident: the incident names the job.
        listed = api.get("/v1/incidents", deployment=job.get("deployment"), limit=100)
    except CoordinatorError:
        return None
    data = listed.get("data", []) if isinstance(listed, dict) else []
    return next((i for i in data if job.get("id") in (i.get("recovery_job_ids") or [])), None)


def watch_job(job_id: str, *, url: str, token: str | None, as_json: bool, timeout_s: float | None) -> None:
    """Follow a job to its end, print the summary (or JSON), exit 1 unless it succeeded."""
    with api_errors(), connect(url, token) as api:
        try:
            job = follow(api, job_id, live=not as_json, timeout_s=timeout_s)
        except WatchTimeout as exc:
            fail(f"{exc} (it keeps running; `epctl jobs watch {job_id}` to follow it again)")
    if as_json:
        print_json(job)
    else:
        print_summary(job)
    if job.get("state") != "succeeded":
        label = "[bold]Cancelled[/]" if job.get("state") == "cancelled" else "[bold red]Error[/]"
        stderr.print(f"{label}: {describe_failure(job)}")
        raise typer.Exit(EXIT_JOB_UNSUCCESSFUL)


@app.command("watch")
def watch(
    job_id: JobIdArgument,
    timeout: TimeoutOption = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Follow a job live until it ends; exit non-zero unless it succeeded."""
    watch_job(job_id, url=url, token=token, as_json=as_json, timeout_s=timeout)


@app.command("cancel")
def cancel(
    job_id: JobIdArgument,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a job (only before its commit starts)."""
    with api_errors(), connect(url, token) as api:
        job = api.post(f"{job_path(job_id)}/cancel")
    if as_json:
        print_json(job)
        return
    state = (job or {}).get("state")
    if state == "cancelled":
        stdout.print(f"Job {job_id} cancelled.")
    else:
        stdout.print(
            f"Cancel requested for job {job_id} (now {styled_state(state)}); "
            f"`epctl jobs watch {job_id}` to see it end."
        )


@cleanup_app.command("retry")
def cleanup_retry(
    job_id: JobIdArgument,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run a job's failed background cleanup again."""
    _cleanup_action(job_id, "retry", url=url, token=token, as_json=as_json)


@cleanup_app.command("ack")
def cleanup_ack(
    job_id: JobIdArgument,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Acknowledge a job's failed cleanup, so the deployment may reconfigure again."""
    _cleanup_action(job_id, "acknowledge", url=url, token=token, as_json=as_json)


def _cleanup_action(job_id: str, action: str, *, url: str, token: str | None, as_json: bool) -> None:
    with api_errors(), connect(url, token) as api:
        job = api.post(f"{job_path(job_id)}/cleanup/{action}")
    if as_json:
        print_json(job)
        return
    state = (job or {}).get("cleanup_state", "?")
    verb = "retried" if action == "retry" else "acknowledged"
    stdout.print(f"Cleanup of job {job_id} {verb}: cleanup is now {state}.")
