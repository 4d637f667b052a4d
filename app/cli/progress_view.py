"""A running job's progress as `epctl` shows it while it waits: a live panel on a terminal, one plain
line per change elsewhere (logs, pipes, tests)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from app.cli.client import PHASE_ORDER, duration_ms, fmt_ms, stdout, styled_state

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live


def progress_of(job: dict[str, Any]) -> tuple[float, str | None]:
    progress = job.get("progress") or {}
    if isinstance(progress, dict):
        return float(progress.get("percent") or 0.0), progress.get("step")
    return float(job.get("progress_percent") or 0.0), job.get("progress_step")


class ProgressView:
    """A rich live panel on a terminal; one plain line per change otherwise (logs, pipes, tests)."""

    def __init__(self, *, live: bool) -> None:
        self.enabled = live
        self.interactive = live and stdout.is_terminal
        self.live: Live | None = None
        self.last_line: str | None = None
        self.job: dict[str, Any] | None = None

    def update(self, job: dict[str, Any]) -> None:
        self.job = job
        if not self.enabled:
            return
        if self.interactive:
            if self.live is None:
                from rich.live import Live

                self.live = Live(
                    self.render(job), console=stdout.console, refresh_per_second=8, transient=True
                )
                self.live.start()
            else:
                self.live.update(self.render(job))
            return
        percent, step = progress_of(job)
        line = f"{job.get('state')} {percent:5.1f}%" + (f"  {step}" if step else "")
        if line != self.last_line:
            stdout.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {line}")
            self.last_line = line

    def note(self, message: str) -> None:
        if self.enabled:
            stdout.print(f"[dim]{message}[/]")

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    @staticmethod
    def render(job: dict[str, Any]) -> RenderableType:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        percent, step = progress_of(job)
        head = Text.from_markup(
            f"[bold]{job.get('deployment')}[/] {job.get('from_dp_size')} -> {job.get('to_dp_size')}  "
            f"{styled_state(job.get('state'))}  [dim]{job.get('id')}[/]"
        )
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=100, completed=percent, width=40),
            Text(f"{percent:3.0f}%"),
            Text(step or "", style="dim"),
        )
        phases = job.get("phases") or {}
        chips = []
        for name in PHASE_ORDER:
            times = phases.get(name)
            if times is None:
                chips.append(f"[dim]{name}[/]")
            elif times.get("ended_at"):
                took = fmt_ms(duration_ms(times.get("started_at"), times.get("ended_at")))
                chips.append(f"[green]{name}[/] [dim]{took}[/]")
            else:
                chips.append(f"[bold cyan]{name}...[/]")
        return Group(head, bar, Text.from_markup("  ".join(chips)))
