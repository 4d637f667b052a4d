"""`epctl tokens create|list|revoke`: API tokens (needs an admin token)."""

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
    stderr,
    stdout,
    table,
)

app = command_group("API tokens and their roles (admin only).")
ROLES = ("viewer", "autoscaler", "operator", "admin")
_COLUMNS = ["ID", "NAME", "ROLE", "PREFIX", "CREATED BY", "CREATED", "LAST USED", "REVOKED"]


def _rows(tokens: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            t.get("id"),
            t.get("name"),
            t.get("role"),
            t.get("token_prefix"),
            t.get("created_by"),
            short_time(t.get("created_at")),
            short_time(t.get("last_used_at")),
            short_time(t.get("revoked_at")) if t.get("revoked_at") else "",
        ]
        for t in tokens
    ]


@app.command("list")
def list_tokens(url: UrlOption = DEFAULT_URL, token: TokenOption = None, as_json: JsonOption = False) -> None:
    """List tokens (secrets are never shown again; revoked ones stay listed)."""
    with api_errors(), connect(url, token) as api:
        result = api.get("/v1/tokens")
    if as_json:
        print_json(result)
        return
    stdout.print(table(None, _COLUMNS, _rows(result.get("data", []))))


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="A unique name: letters, digits and _ . : @ -.")],
    role: Annotated[
        str, typer.Option("--role", "-r", help=f"One of: {', '.join(ROLES)}.", show_default=True)
    ] = "viewer",
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a token. Its secret is printed once: store it now."""
    if role not in ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(ROLES)}", param_hint="--role")
    with api_errors(), connect(url, token) as api:
        created = api.post("/v1/tokens", {"name": name, "role": role})
    if as_json:
        print_json(created)
        return
    stderr.print(f"created token {created['name']} ({created['role']}, {created['id']}); secret, shown once:")
    stdout.print(created["token"])


@app.command("revoke")
def revoke(
    ref: Annotated[str, typer.Argument(metavar="TOKEN", help="The token's id or name.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Revoke a token: refused from now on, kept in the list with its revocation time."""
    with api_errors(), connect(url, token) as api:
        revoked = api.request("DELETE", f"/v1/tokens/{ref}")
    if as_json:
        print_json(revoked)
        return
    stdout.print(f"revoked {revoked['name']} ({revoked['id']}) at {short_time(revoked['revoked_at'])}")
