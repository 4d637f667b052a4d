"""`epctl incidents list|show`: every time a deployment stopped being whole, and what clients saw."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.client import (
    DEFAULT_URL,
    NOT_MEASURED,
    DeploymentFilter,
    JsonOption,
    TokenOption,
    UrlOption,
    api_errors,
    command_group,
    connect,
    fmt_ms,
    print_json,
    short_time,
    stdout,
    table,
)

app = command_group("Incidents: a deployment that stopped being whole, what was lost, how long it took.")


@app.command("list")
def list_incidents(
    deployment: DeploymentFilter = None,
    state: Annotated[str | None, typer.Option(help="open or resolved")] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List incidents, newest first."""
    with api_errors(), connect(url, token) as api:
        result = api.get("/v1/incidents", deployment=deployment, state=state)
    if as_json:
        print_json(result)
        return
    data = result.get("data", [])
    if not data:
        stdout.print("No incidents.")
        return
    rows = [
        [
            i.get("id"),
            i.get("deployment"),
            i.get("state"),
            i.get("reason"),
            ", ".join(i.get("engines") or []) or "-",
            short_time(i.get("loss_at")),
            fmt_ms(i.get("time_to_serving_ms")),
            _outage_short(i),
            i.get("hit_job_id") or "-",
            ", ".join(i.get("recovery_job_ids") or []) or "-",
        ]
        for i in data
    ]
    columns = [
        "INCIDENT",
        "DEPLOYMENT",
        "STATE",
        "REASON",
        "LOST",
        "AT",
        "TO SERVING",
        "CLIENT OUTAGE",
        "AFTER JOB",
        "RECOVERED BY",
    ]
    stdout.print(table(None, columns, rows))


@app.command("show")
def show_incident(
    incident_id: Annotated[str, typer.Argument(help="the incident's id (inc_...)")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """One incident: what was lost, when, detection and recovery times, the client outage, the jobs."""
    with api_errors(), connect(url, token) as api:
        incident = api.get(f"/v1/incidents/{incident_id}")
    if as_json:
        print_json(incident)
        return
    lines = [
        f"[bold]{incident['id']}[/] {incident['deployment']} {incident['state']}: {incident['reason']}",
        f"  {incident['message']}",
        f"  lost: {', '.join(incident.get('engines') or []) or '-'} (generation {incident['generation']})",
        f"  loss at {short_time(incident['loss_at'])} ({incident.get('loss_evidence') or 'recorded'}),"
        f" detected after {fmt_ms(incident['time_to_detect_ms'])},"
        f" serving again after {fmt_ms(incident.get('time_to_serving_ms'))}",
        f"  client outage: {_outage(incident)}",
    ]
    if incident.get("hit_job_id"):
        lines.append(f"  right after job {incident['hit_job_id']}")
    if incident.get("recovery_job_ids"):
        lines.append(f"  recovered by {', '.join(incident['recovery_job_ids'])}")
    for line in lines:
        stdout.print(line)


def _outage_short(incident: dict[str, object]) -> str:
    """The list's cell: the figure, "not measured", or "not over" while open."""
    figure = incident.get("client_outage_ms")
    if isinstance(figure, int | float):
        return fmt_ms(figure)
    if incident.get("outage_evidence") == "not-measured":
        return NOT_MEASURED
    return "not over" if incident.get("state") == "open" else "-"


def _outage(incident: dict[str, object]) -> str:
    """The client outage and what it rests on; "not measured" where nothing measured it (never 0)."""
    evidence = incident.get("outage_evidence")
    figure = incident.get("client_outage_ms")
    if evidence == "not-measured":
        return f"{NOT_MEASURED} (nothing watched when it began, and nothing saw clients fail)"
    if evidence is None:
        return "not decided yet" if incident.get("state") == "open" else "-"
    value = fmt_ms(figure if isinstance(figure, int | float) else None)
    return f"{value} (from {evidence}, until the deployment served again)"
