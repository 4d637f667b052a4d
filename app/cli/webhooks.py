"""`epctl webhooks list|create|delete|deliveries|rotate-secret|replay`."""

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
    short_time,
    stdout,
    table,
)

app = command_group("Outbound webhook subscriptions and their delivery log.")

EVENT_TYPES = (
    "reconfiguration.started",
    "reconfiguration.phase_changed",
    "reconfiguration.succeeded",
    "reconfiguration.failed",
    "reconfiguration.rolled_back",
    "reconfiguration.cancelled",
    "reconfiguration.cleanup_failed",
    "engine.unreachable",
)


def _subscription_rows(subscriptions: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            s.get("id"),
            s.get("url"),
            ", ".join(s.get("event_types") or []) or "all",
            s.get("active"),
            s.get("description"),
            short_time(s.get("created_at")),
        ]
        for s in subscriptions
    ]


_COLUMNS = ["ID", "URL", "EVENTS", "ACTIVE", "DESCRIPTION", "CREATED"]


@app.command("list")
def list_webhooks(
    url: UrlOption = DEFAULT_URL, token: TokenOption = None, as_json: JsonOption = False
) -> None:
    """List webhook subscriptions."""
    with api_errors(), connect(url, token) as api:
        result = api.get("/v1/webhooks")
    if as_json:
        print_json(result)
        return
    data = result.get("data", []) if isinstance(result, dict) else result
    if not data:
        stdout.print("No webhook subscriptions.")
        return
    stdout.print(table(None, _COLUMNS, _subscription_rows(data)))


@app.command("create")
def create(
    target_url: Annotated[str, typer.Argument(metavar="URL", help="Where events are POSTed.")],
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event",
            "-e",
            help="An event type to send (repeatable; default: all). Short names work: succeeded, failed, ...",
        ),
    ] = None,
    description: Annotated[str | None, typer.Option("--description", help="A note for operators.")] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Subscribe URL to reconfiguration events. The signing secret is shown once."""
    body: dict[str, Any] = {"url": target_url, "event_types": [_event_type(e) for e in event or []]}
    if description:
        body["description"] = description
    with api_errors(), connect(url, token) as api:
        subscription = api.post("/v1/webhooks", body)
    if as_json:
        print_json(subscription)
        return
    stdout.print(f"Created webhook [bold]{subscription.get('id')}[/] -> {subscription.get('url')}")
    secret = subscription.get("secret")
    if secret:
        stdout.print(f"signing secret (shown once, keep it): [bold]{secret}[/]")


def _event_type(name: str) -> str:
    full = name if "." in name else f"reconfiguration.{name}"  # `-e failed` or a full type
    if full not in EVENT_TYPES:
        raise typer.BadParameter(f"unknown event {name!r}; one of: {', '.join(EVENT_TYPES)}")
    return full


@app.command("delete")
def delete(
    webhook_id: Annotated[str, typer.Argument(help="Subscription id.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete a webhook subscription."""
    with api_errors(), connect(url, token) as api:
        api.delete(f"/v1/webhooks/{webhook_id}")
    if as_json:
        print_json({"deleted": webhook_id})
    else:
        stdout.print(f"Deleted webhook {webhook_id}.")


@app.command("deliveries")
def deliveries(
    webhook_id: Annotated[str, typer.Argument(help="Subscription id.")],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=500)] = 50,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a subscription's delivery log (every attempt is kept)."""
    with api_errors(), connect(url, token) as api:
        result = api.get(f"/v1/webhooks/{webhook_id}/deliveries", limit=limit)
    if as_json:
        print_json(result)
        return
    data = result.get("data", []) if isinstance(result, dict) else result
    if not data:
        stdout.print("No deliveries yet.")
        return
    rows = [
        [
            d.get("id"),
            d.get("event_type") or d.get("type") or d.get("event_id"),
            d.get("state"),
            d.get("attempt_count"),
            d.get("last_status_code"),
            d.get("last_error"),
            short_time(d.get("delivered_at") or d.get("next_attempt_at") or d.get("created_at")),
        ]
        for d in data
    ]
    stdout.print(
        table(None, ["DELIVERY", "EVENT", "STATE", "ATTEMPTS", "LAST STATUS", "LAST ERROR", "WHEN"], rows)
    )


@app.command("rotate-secret")
def rotate_secret(
    webhook_id: Annotated[str, typer.Argument(help="Subscription id.")],
    overlap_s: Annotated[
        float | None,
        typer.Option("--overlap", help="Seconds the old secret keeps signing too (default: a day; 0: none)."),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """A new signing secret, shown once; the old one signs too until the overlap ends."""
    with api_errors(), connect(url, token) as api:
        result = api.post(f"/v1/webhooks/{webhook_id}/rotate-secret", params={"overlap_s": overlap_s})
    if as_json:
        print_json(result)
        return
    stdout.print(f"New secret (shown once): {result.get('secret')}")
    if result.get("previous_secret_expires_at"):
        stdout.print(f"The old secret signs too until {result['previous_secret_expires_at']}.")


@app.command("replay")
def replay(
    webhook_id: Annotated[str, typer.Argument(help="Subscription id.")],
    since: Annotated[str, typer.Option("--since", help="RFC 3339 time, e.g. 2026-12-01T12:00:00Z.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Send every event since `--since` again, in order, with its original webhook-id."""
    with api_errors(), connect(url, token) as api:
        result = api.post(f"/v1/webhooks/{webhook_id}/replay", params={"since": since})
    if as_json:
        print_json(result)
        return
    more = " (more matched: replay again later)" if result.get("truncated") else ""
    stdout.print(f"Queued {result.get('queued')} event(s) for {webhook_id}{more}.")
