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
        self.step: str | None = None
        self.step_since = time.monotonic()  # when the current step began (as this view saw it)
        self.last_printed = time.monotonic()

    def update(self, job: dict[str, Any]) -> None:
        self.job = job
        step = progress_of(job)[1]
        if step != self.step:
            self.step, self.step_since = step, time.monotonic()
        if not self.enabled:
            return
        if self.interactive:
            if self.live is None:
                from rich.live import Live

                # Drawn at every refresh, so the time in the step moves between events (a launch that
                # starts engines holds one step for tens of seconds).
                self.live = Live(self, console=stdout.console, refresh_per_second=4, transient=True)
                self.live.start()
            return
        percent, step = progress_of(job)
        line = f"{job.get('state')} {percent:5.1f}%" + (f"  {step}" if step else "")
        if line != self.last_line:
            self._print(line)
            self.last_line = line
        else:
            self.tick()

    STILL_EVERY_S = 10.0

    def tick(self) -> None:
        """Plain lines: one at least every 10 s while a step holds (a launch), saying how long so far."""
        if not self.enabled or self.interactive or self.job is None or self.last_line is None:
            return
        if time.monotonic() - self.last_printed >= self.STILL_EVERY_S:
            self._print(f"{self.last_line}  (still; {time.monotonic() - self.step_since:.0f} s in this step)")

    def _print(self, line: str) -> None:
        # Times in UTC, as every other time epctl prints.
        stdout.print(f"[dim]{time.strftime('%H:%M:%S', time.gmtime())}[/] {line}")
        self.last_printed = time.monotonic()

    def note(self, message: str) -> None:
        if self.enabled:
            stdout.print(f"[dim]{message}[/]")

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def __rich__(self) -> RenderableType:
        assert self.job is not None
        return self.render(self.job, time.monotonic() - self.step_since)

    @staticmethod
    def render(job: dict[str, Any], in_step_s: float | None = None) -> RenderableType:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        percent, step = progress_of(job)
        in_step = f" · {in_step_s:.0f} s in this step" if in_step_s is not None and step else ""
        head = Text.from_markup(
            f"[bold]{job.get('deployment')}[/] {job.get('from_dp_size')} -> {job.get('to_dp_size')}  "
            f"{styled_state(job.get('state'))}  [dim]{job.get('id')}[/]"
        )
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=100, completed=percent, width=40),
            Text(f"{percent:3.0f}%"),
            Text((step or "") + in_step, style="dim"),
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
