"""`epctl engines list`."""

from __future__ import annotations

from app.cli.client import (
    DEFAULT_URL,
    DeploymentFilter,
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

app = command_group("Engines: the registered agents, one DP rank each.")


@app.command("list")
def list_engines(
    deployment: DeploymentFilter = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List registered engines."""
    with api_errors(), connect(url, token) as api:
        result = api.get("/v1/engines", deployment=deployment)
    if as_json:
        print_json(result)
        return
    data = result.get("data", [])
    if not data:
        stdout.print("No engines.")
        return
    rows = [
        [
            e.get("id"),
            e.get("deployment"),
            e.get("dp_rank"),
            e.get("world_size"),
            e.get("generation"),
            e.get("state"),
            f"{e.get('platform')}/{e.get('device')}",
            e.get("url"),
            short_time(e.get("last_heartbeat_at")),
        ]
        for e in data
    ]
    columns = ["ENGINE", "DEPLOYMENT", "RANK", "WORLD", "GEN", "STATE", "PLATFORM", "URL", "LAST HEARTBEAT"]
    stdout.print(table(None, columns, rows))
