"""The CLI's side of the coordinator API: a small client, shared options and output helpers.

Every command takes `--url` / `--token` (or `EPCTL_URL` / `EPCTL_TOKEN`) and `--json`, before or after
the command. An error answer (problem+json) is printed readably on stderr and the command exits
non-zero:

    exit 0  success
    exit 1  the coordinator refused the request (4xx/5xx problem), or a watched job did not succeed
    exit 2  usage error (typer's)
    exit 3  the coordinator could not be reached

Imports stay light (the standard library and typer): rich is imported when something is printed,
the HTTP client when a command connects, so `epctl --help` and simple reads start fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from app.cli.http import HttpClient, Response, StreamingResponse, TransportError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

DEFAULT_URL = "http://127.0.0.1:8000"
# Requests the CLI makes on an operator's behalf are recorded as coming from the CLI.
CLI_SOURCE = "cli"

EXIT_REFUSED = 1
EXIT_JOB_UNSUCCESSFUL = 1
EXIT_UNREACHABLE = 3

UrlOption = Annotated[
    str,
    typer.Option("--url", envvar="EPCTL_URL", help="Coordinator base URL.", show_default=True),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="EPCTL_TOKEN", help="Bearer token (EPCTL_TOKEN).", show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DeploymentFilter = Annotated[str | None, typer.Option("--deployment", "-d", help="Only this deployment.")]


def command_group(help_text: str) -> typer.Typer:
    """A group of commands. Help in plain text: rich's renderer costs more CPU to import than a
    command may take to start."""
    return typer.Typer(
        help=help_text, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False
    )


class LazyConsole:
    """A rich `Console` made on first use (importing rich costs CPU that `--help` need not pay)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            options = dict(self._options)
            if options.pop("wide_when_piped", False):
                # Piped output (scripts, logs) gets wide lines instead of tables folded at 80 columns.
                options["width"] = None if sys.stdout.isatty() else 250
            self._console = Console(**options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


stdout = LazyConsole(highlight=False, soft_wrap=False, wide_when_piped=True)
stderr = LazyConsole(stderr=True, highlight=False, soft_wrap=True)  # messages are never cut mid-line


class CoordinatorError(Exception):
    """An error answer from the coordinator, carrying its problem document."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        super().__init__(self.summary())

    def summary(self) -> str:
        title = self.problem.get("title") or f"HTTP {self.status}"
        detail = self.problem.get("detail")
        return f"{title}: {detail}" if detail and detail != title else str(title)


class CoordinatorUnreachable(Exception):
    pass


@dataclass
class Coordinator:
    """A thin synchronous client: JSON in, JSON out, problems raised as CoordinatorError."""

    url: str
    token: str | None
    timeout_s: float = 15.0
    http: HttpClient = field(init=False)

    def __post_init__(self) -> None:
        headers = {"Accept": "application/json", "User-Agent": "epctl"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            self.http = HttpClient(self.url.rstrip("/"), headers=headers, timeout_s=self.timeout_s)
        except TransportError as exc:
            raise CoordinatorUnreachable(f"cannot reach the coordinator at {self.url}: {exc}") from exc

    def close(self) -> None:
        """Nothing held between requests (one connection each)."""

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        clean_params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self.http.request(
                method, path, json_body=json_body, params=clean_params, headers=headers
            )
        except TransportError as exc:
            raise CoordinatorUnreachable(f"cannot reach the coordinator at {self.url}: {exc}") from exc
        return self.decode(response)

    @contextmanager
    def stream(
        self, path: str, *, headers: Mapping[str, str], read_timeout_s: float
    ) -> Iterator[StreamingResponse]:
        """A GET whose body is read line by line (`StreamInterrupted` when it goes quiet or drops)."""
        with self.http.stream("GET", path, headers=headers, read_timeout_s=read_timeout_s) as response:
            yield response

    @staticmethod
    def decode(response: Response) -> Any:
        if response.is_error:
            raise CoordinatorError(response.status, _problem_of(response))
        if response.status == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json_body=body, **kwargs)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, json_body=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


def _problem_of(response: Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {
        "title": response.reason or f"HTTP {response.status}",
        "detail": response.text[:500] or None,
        "status": response.status,
    }


def connect(url: str, token: str | None) -> Coordinator:
    return Coordinator(url=url or DEFAULT_URL, token=token or None)


# Problem members shown as the headline; the rest are printed as "key: value" lines.
_PROBLEM_HEADLINE = {"type", "title", "status", "detail", "instance"}


def print_problem(error: CoordinatorError) -> None:
    problem = error.problem
    stderr.print(f"[bold red]Error {error.status}[/]: {error.summary()}")
    for key, value in problem.items():
        if key in _PROBLEM_HEADLINE or value in (None, "", [], {}):
            continue
        if key == "errors" and isinstance(value, list):
            for item in value:
                stderr.print(f"  - {_validation_line(item)}")
            continue
        rendered = value if isinstance(value, str | int | float) else json.dumps(value)
        stderr.print(f"  {key}: {rendered}")
    if problem.get("type") and problem.get("type") != "about:blank":
        stderr.print(f"  [dim]type: {problem['type']}[/]")
    if problem.get("code") == "missing-token":
        stderr.print(f"  [yellow]hint:[/] {missing_token_hint()}")


def missing_token_hint() -> str:
    """Where a token comes from: `--token` or EPCTL_TOKEN, and the admin token `epctl up` keeps in its
    data directory (EPCTL_DATA_DIR, default .data) when that file is here."""
    import os
    from pathlib import Path

    kept = Path(os.environ.get("EPCTL_DATA_DIR") or ".data") / "admin-token"
    where = (
        f"export EPCTL_TOKEN=$(cat {kept})  (the admin token `epctl up` keeps)"
        if kept.is_file()
        else "`epctl up` keeps its admin token in <data dir>/admin-token (EPCTL_DATA_DIR, default .data)"
    )
    return f"no token was sent: pass --token or set EPCTL_TOKEN; {where}"


def _validation_line(item: Any) -> str:
    if isinstance(item, dict):
        loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
        message = item.get("msg") or item.get("message") or json.dumps(item)
        return f"{loc}: {message}" if loc else str(message)
    return str(item)


def fail(message: str, code: int = EXIT_REFUSED) -> NoReturn:
    stderr.print(f"[bold red]Error[/]: {message}")
    raise typer.Exit(code)


@contextmanager
def api_errors() -> Iterator[None]:
    """Turn coordinator errors into a readable message and a non-zero exit."""
    try:
        yield
    except CoordinatorError as error:
        print_problem(error)
        raise typer.Exit(EXIT_REFUSED) from None
    except CoordinatorUnreachable as error:
        stderr.print(f"[bold red]Error[/]: {error}")
        stderr.print("  [dim]set --url or EPCTL_URL to the coordinator's address[/]")
        raise typer.Exit(EXIT_UNREACHABLE) from None


# --- output -------------------------------------------------------------------------------------------


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


# Columns that may wrap on a narrow terminal; ids, states and times stay on one line.
_PROSE_COLUMNS = frozenset({"MESSAGE", "DESCRIPTION", "LAST ERROR", "URL", "PAUSED (UTC)"})


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> Table:
    from rich.table import Table

    out = Table(title=title, title_justify="left", header_style="bold", box=None, pad_edge=False)
    for name in columns:
        prose = name in _PROSE_COLUMNS
        out.add_column(
            name,
            justify="right" if name.endswith(("ms", "size", "#", "%")) else "left",
            overflow="fold",
            no_wrap=not prose,
        )
    for row in rows:
        out.add_row(*[_cell(value) for value in row])
    return out


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


# A job's phases in the order they run (the summary's table and the live chips follow it).
PHASE_ORDER = ("preparing", "syncing", "committing", "cleaning_up")

STATE_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "rolled_back": "yellow",
    "cancelled": "magenta",
    "pending": "dim",
}


def styled_state(state: str | None) -> str:
    if not state:
        return "-"
    return f"[{STATE_STYLE.get(state, 'cyan')}]{state}[/]"


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# One clock and one duration format for every command, as the dashboard shows them: times in UTC with
# the zone named ("2026-12-06 07:17:02 UTC"), durations by size ("6.67 ms", "18.0 ms", "320 ms",
# "1.92 s", "37.7 s", "2 min 5 s").
def short_time(value: str | None) -> str:
    parsed = parse_time(value)
    return parsed.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if parsed else "-"


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms == 0:
        return "0 ms"
    if ms < 10:
        return f"{ms:.2f} ms"
    if ms < 100:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s" if ms < 10_000 else f"{ms / 1000:.1f} s"
    seconds = round(ms / 1000)
    return f"{seconds // 60} min {seconds % 60} s"


NOT_MEASURED = "not measured"


def client_outage_ms(job: Mapping[str, Any]) -> float | None:
    """The job's client outage, or None where nothing measured it: no probe ran, or its probe sent no
    canary (a 0 from no canary is no measurement)."""
    outage = job.get("client_outage_ms")
    if not isinstance(outage, int | float):
        return None
    probe = job.get("probe")
    if not outage and isinstance(probe, dict) and probe.get("canaries_sent") == 0:
        return None
    return float(outage)


def fmt_outage(job: Mapping[str, Any]) -> str:
    outage = client_outage_ms(job)
    return NOT_MEASURED if outage is None else fmt_ms(outage)


def duration_ms(start: str | None, end: str | None) -> float | None:
    a, b = parse_time(start), parse_time(end)
    if a is None or b is None:
        return None
    return (b - a).total_seconds() * 1000.0
