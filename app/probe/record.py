"""What a job keeps of its probe, in the same words for every backend: the job's columns
(`client_outage_ms`, `client_slowest_answer_ms`, `probe`), the line that announces them, and the
canaries counted for `/metrics`."""

from __future__ import annotations

from typing import Any

from app import metrics
from app.probe.figures import ProbeFigures


def figures_changes(figures: ProbeFigures, probe: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job columns a probe's figures fill (every backend writes them through this one helper,
    which also counts the canaries for `/metrics`)."""
    metrics.record_canaries(
        ok=figures.sent - figures.failed - figures.late, late=figures.late, failed=figures.failed
    )
    # No canary sent: nothing measured the clients, so no figure (never a 0 nobody saw).
    return {
        "client_outage_ms": figures.outage_ms if figures.sent else None,
        "client_slowest_answer_ms": figures.slowest_answer_ms,
        "probe": probe if probe is not None else figures.as_dict(),
    }


def outage_summary(figures: ProbeFigures) -> str:
    """One line in the job's words: "client outage 0 ms; slowest answer 41.2 ms (pause)"."""
    if not figures.sent:
        return "client outage not measured (no canary sent)"
    notes = [figures.outage_phase] if figures.outage_ms and figures.outage_phase else []
    if figures.probe_stalled_ms > 0:  # the observer's part, named: not a stretch clients had
        notes.append(f"the probe itself stalled {figures.probe_stalled_ms:.1f} ms in it")
    outage = f"client outage {figures.outage_ms:.1f} ms" + (f" ({'; '.join(notes)})" if notes else "")
    if figures.slowest_answer_ms is None:
        return f"{outage}; no canary answered"
    where = f" ({figures.slowest_answer_phase})" if figures.slowest_answer_phase else ""
    return f"{outage}; slowest answer {figures.slowest_answer_ms:.1f} ms{where}"
