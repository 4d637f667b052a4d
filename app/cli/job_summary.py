"""What happened to a finished reconfiguration, as `epctl` prints it: state, downtime, placement, phase
durations, per-engine pauses, the error (and which engine overran its budget), the cleanup."""

from __future__ import annotations

import time
from datetime import UTC
from typing import Any

from app.cli.client import (
    NOT_MEASURED,
    PHASE_ORDER,
    client_outage_ms,
    duration_ms,
    fmt_ms,
    parse_time,
    short_time,
    stdout,
    styled_state,
    table,
)


def generations(result: dict[str, Any], job: dict[str, Any]) -> str | None:
    """The generation this engine served before the job and serves after it (`-`: none; `?`: not
    known yet). Jobs recorded before the per-engine figures show the one generation they kept."""
    if "generation_before" not in result:
        return None if result.get("generation") is None else str(result.get("generation"))
    after = result.get("generation_after")
    if after is None and not job.get("terminal", True):
        after_text = "?"
    else:
        after_text = "-" if after is None else str(after)
    before = result.get("generation_before")
    return f"{'-' if before is None else before} -> {after_text}"


def engine_rows(job: dict[str, Any]) -> list[list[Any]]:
    """One row per engine: id, role, ranks, generation before -> after, pause (ms), paused..resumed."""
    per_engine_ms = ((job.get("downtime") or {}).get("per_engine_ms")) or {}
    rows = []
    seen = set()
    for result in job.get("engine_results") or []:
        if not isinstance(result, dict):
            continue
        engine_id = result.get("engine_id")
        seen.add(engine_id)
        pause = result.get("pause") or {}
        pause_ms = pause.get("pause_ms") if isinstance(pause, dict) else None
        if pause_ms is None:
            pause_ms = per_engine_ms.get(engine_id)
        ranks = result.get("ranks")
        if "old_rank" in result or "new_rank" in result:
            ranks = [result.get("old_rank"), result.get("new_rank")]
        if isinstance(ranks, list | tuple):
            ranks = " -> ".join("-" if r is None else str(r) for r in ranks)
        elif isinstance(ranks, dict):
            ranks = " -> ".join("-" if r is None else str(r) for r in ranks.values())
        rows.append(
            [
                engine_id,
                result.get("role"),
                ranks,
                generations(result, job),
                fmt_ms(pause_ms),
                _pause_window(pause),
            ]
        )
    for engine_id, pause_ms in per_engine_ms.items():
        if engine_id not in seen:
            rows.append([engine_id, None, None, None, fmt_ms(pause_ms), None])
    return rows


def _pause_window(pause: Any) -> str | None:
    if not isinstance(pause, dict) or pause.get("paused_at") is None:
        return None
    start = _clock(pause.get("paused_at"))
    end = _clock(pause.get("resumed_at")) if pause.get("resumed_at") is not None else "still paused"
    return f"{start} .. {end}"


def _clock(value: Any) -> str:
    if isinstance(value, int | float):
        return time.strftime("%H:%M:%S", time.gmtime(value)) + f".{int((value % 1) * 1000):03d}"
    parsed = parse_time(str(value))
    return parsed.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3] if parsed else str(value)


# Jobs that ended on the generation they started on: no new generation to show.
KEPT_GENERATION = ("cancelled", "rolled_back")


def generation_text(job: dict[str, Any]) -> str:
    if job.get("state") in KEPT_GENERATION:
        return f"generation {job.get('from_generation')} (unchanged)"
    return f"generation {job.get('from_generation')} -> {job.get('to_generation')}"


def partial_text(job: dict[str, Any]) -> str | None:
    """A partial grow's reach (issue 38); None where the job reached its target (or is not planned)."""
    reached, target = job.get("reached_dp_size"), job.get("to_dp_size")
    if reached is None or target is None or reached >= target:
        return None
    return f"DP {reached} of {target} (the rest stands as the deployment's target)"


def print_summary(job: dict[str, Any]) -> None:
    state = job.get("state")
    stdout.print(
        f"Job [bold]{job.get('id')}[/] {styled_state(state)}  "
        f"{job.get('deployment')}: DP {job.get('from_dp_size')} -> {job.get('to_dp_size')}, "
        f"{generation_text(job)}"
    )
    details = [
        ("requested by", job.get("requested_by")),
        ("reached", partial_text(job)),
        ("reason", job.get("reason")),
        ("warm-up", job.get("warmup_policy") or job.get("warmup_policy_requested")),
        ("strategy", job.get("strategy")),
        ("commit", job.get("commit")),
        (
            "downtime budget",
            f"{job['max_downtime_ms']} ms" if job.get("max_downtime_ms") is not None else None,
        ),
        ("created", short_time(job.get("created_at"))),
        ("took", fmt_ms(duration_ms(job.get("created_at"), job.get("finished_at")))),
    ]
    stdout.print("  ".join(f"[dim]{k}:[/] {v}" for k, v in details if v not in (None, "")))
    downtime = job.get("downtime_ms")
    stdout.print(f"[bold]downtime:[/] {fmt_ms(downtime) if downtime is not None else '-'}{client_line(job)}")
    door = front_door_line(job)
    if door:
        stdout.print(door)
    parts = ((job.get("downtime") or {}).get("window_parts_ms")) or {}
    if parts:
        stdout.print("[dim]inside the window:[/] " + ", ".join(f"{k} {fmt_ms(v)}" for k, v in parts.items()))
    placement_line = describe_placement(job)
    if placement_line:
        stdout.print(placement_line)
    phases = job.get("phases") or {}
    if phases:
        ordered = sorted(
            phases.items(),
            key=lambda kv: PHASE_ORDER.index(kv[0]) if kv[0] in PHASE_ORDER else len(PHASE_ORDER),
        )
        rows = [
            [
                name,
                short_time(t.get("started_at")),
                fmt_ms(duration_ms(t.get("started_at"), t.get("ended_at")))
                if t.get("ended_at")
                else "running",
            ]
            for name, t in ordered
        ]
        stdout.print(table("phases", ["PHASE", "STARTED", "DURATION"], rows))
    engines = engine_rows(job)
    if engines:
        columns = ["ENGINE", "ROLE", "RANKS", "GENERATION", "PAUSE", "PAUSED (UTC)"]
        stdout.print(table("engines", columns, engines))
    print_failure(job)


def client_line(job: dict[str, Any]) -> str:
    """What the canary probe saw, in the job's words: the client outage (the headline), the slowest
    answer with its phase, and the canaries; "not measured" where no canary ran (never a 0 nobody saw);
    a job recorded before the outage and the slowest answer were told apart shows its old figure."""
    probe = job.get("probe") or {}
    outage, slowest = client_outage_ms(job), job.get("client_slowest_answer_ms")
    counts = (
        f"[dim](canary probe: {probe.get('canaries_sent', '?')} sent, "
        f"{probe.get('canaries_failed', '?')} failed, {probe.get('canaries_late', 0)} late)[/]"
    )
    if outage is None:
        old = job.get("client_downtime_ms") if job.get("client_outage_ms") is None else None
        if old is not None:
            return f"  [bold]client downtime (old figure):[/] {fmt_ms(old)} {counts}"
        why = "no canary sent" if probe.get("canaries_sent") == 0 else "no canary probe ran"
        return f"  [bold]client outage:[/] {NOT_MEASURED} [dim]({why})[/]"
    line = f"  [bold]client outage:[/] {fmt_ms(outage)}"
    if outage and probe.get("outage_phase"):
        line += f" [dim]({probe['outage_phase']})[/]"
    elif not outage and probe.get("canaries_failed"):
        # Failures that never made a stretch with no answer: another engine answered meanwhile.
        line += " [dim](failed canaries were answered elsewhere in time)[/]"
    if slowest is not None:
        line += f"  [bold]slowest answer:[/] {fmt_ms(slowest)}"
        if probe.get("slowest_answer_phase"):
            line += f" [dim]({probe['slowest_answer_phase']})[/]"
    return f"{line}  {counts}"


def self_heal_lines(job: dict[str, Any], incident: dict[str, Any] | None) -> list[str]:
    """A self-heal job's loss, detection and serving-again times, and the incident it belongs to (with
    the clients' outage the incident measured from the loss)."""
    lines = []
    if job.get("loss_at") is not None:
        lines.append(
            f"[bold]loss:[/] at {short_time(job['loss_at'])}, detected after "
            f"{fmt_ms(job.get('time_to_detect_ms'))}, "
            f"serving again after {fmt_ms(job.get('time_to_serving_ms'))}"
        )
    if incident is not None:
        outage = incident.get("client_outage_ms")
        figure = NOT_MEASURED if not isinstance(outage, int | float) else fmt_ms(outage)
        lines.append(
            f"[bold]incident:[/] {incident.get('id')} ({incident.get('state')}, {incident.get('reason')}): "
            f"client outage {figure} from the loss; `epctl incidents show {incident.get('id')}`"
        )
    elif job.get("incident_id"):
        lines.append(f"[bold]incident:[/] {job['incident_id']}; `epctl incidents show {job['incident_id']}`")
    return lines


def front_door_line(job: dict[str, Any]) -> str | None:
    """The job's requests at the front door (issue 35): passed, failed by cause, retried, drained."""
    counted = job.get("front_door_requests")
    if not counted:
        return None
    failed = counted.get("failed") or {}
    causes = ", ".join(f"{cause} {n}" for cause, n in failed.items() if n) or "none"
    drained = counted.get("drained") or {}
    held = sum(d.get("in_flight_at_drain") or 0 for d in drained.values())
    longest = max((d.get("drained_ms") or 0.0 for d in drained.values()), default=0.0)
    senders = counted.get("by_sender")
    clients = ""
    if isinstance(senders, dict):
        mine, ours = senders.get("clients") or {}, senders.get("canaries") or {}
        clients = (
            f" ({mine.get('requests', 0)} from clients, {mine.get('failed', 0)} of them failed; "
            f"{ours.get('requests', 0)} canaries)"
        )
    line = (
        f"[bold]front door:[/] {counted.get('requests', 0)} requests{clients}, failed: {causes}, "
        f"{counted.get('retried', 0)} retried, {counted.get('redispatched', 0)} redispatched"
    )
    if drained:
        line += f"; leavers drained: {held} in flight, done in {fmt_ms(longest)}"
    window = counted.get("held")
    if isinstance(window, dict):
        wait = window.get("longest_wait_ms")
        line += f"; held in the window: {window.get('count', 0)}" + (
            f", longest wait {fmt_ms(wait)}" if isinstance(wait, int | float) else ""
        )
    return line


def describe_placement(job: dict[str, Any]) -> str | None:
    """Copies and bytes the new placement moved, and the rank map (old -> new; `-` for a leaver)."""
    placement = job.get("placement")
    if not placement:
        return None
    mib = (placement.get("bytes_moved") or 0) / (1 << 20)
    line = (
        f"[bold]placement:[/] {placement.get('copies_moved')} expert copies moved ({mib:.1f} MiB), "
        f"lower bound {placement.get('lower_bound')}; {placement.get('layers', 1)} layer(s)"
    )
    ranks = placement.get("rank_map") or {}
    if ranks:
        moves = ", ".join(
            f"{engine} {r.get('old') if r.get('old') is not None else '+'}->"
            f"{r.get('new') if r.get('new') is not None else '-'}"
            for engine, r in ranks.items()
        )
        line += f"\n[bold]rank map:[/] {moves}"
    if job.get("retire"):
        line += f"  [dim](retired by request: {', '.join(job['retire'])})[/]"
    return line


def describe_overrun(job: dict[str, Any]) -> str | None:
    """For a `downtime-budget-exceeded` error: which engine overran, in which part, against what budget."""
    error = job.get("error") or {}
    overrun = error.get("overrun")
    if error.get("type") != "downtime-budget-exceeded" or not overrun:
        return None
    return (
        f"[bold]over budget:[/] engine {overrun['engine_id']}, part {overrun['part']} "
        f"(stopped {overrun['stopped_ms']} ms of a {overrun['budget_ms']} ms budget)"
    )


def print_failure(job: dict[str, Any]) -> None:
    error = job.get("error")
    if error and job.get("state") == "cancelled":
        # An operator's cancel, not a fault: what it stopped, without an error's colours.
        where = f" during {error['phase']}" if error.get("phase") else ""
        stdout.print(f"[bold]cancelled{where}[/]: {error.get('message') or 'on request'}")
    elif error:
        where = ", ".join(f"{k} {error[k]}" for k in ("phase", "engine_id") if error.get(k))
        if error.get("http_status") is not None:
            where += f"{', ' if where else ''}engine answered {error['http_status']}"
        stdout.print(
            f"[bold red]error[/] ({error.get('type')}{'; ' + where if where else ''}): {error.get('message')}"
        )
        if error.get("hint"):
            stdout.print(f"  [yellow]hint:[/] {error['hint']}")
        overrun = describe_overrun(job)
        if overrun:
            stdout.print(f"  {overrun}")
    cleanup_state = job.get("cleanup_state")
    if cleanup_state and cleanup_state not in ("none", "succeeded"):
        style = "red" if cleanup_state == "failed" else "yellow"
        stdout.print(f"[bold {style}]cleanup {cleanup_state}[/]: {describe_cleanup(job)}")
        if cleanup_state == "failed":
            stdout.print(
                f"  the next job of {job.get('deployment')} is refused until "
                f"`epctl cleanup retry {job.get('id')}` or `epctl cleanup ack {job.get('id')}`"
            )


def describe_cleanup(job: dict[str, Any]) -> str:
    """One line about the background destruction of the retired generation."""
    cleanup = job.get("cleanup") or {}
    if not isinstance(cleanup, dict):
        return str(cleanup)
    generation = cleanup.get("failed_generation") or cleanup.get("retired_generation")
    what = f"generation {generation}" if generation is not None else "retired groups"
    if job.get("cleanup_state") == "failed":
        return f"destroying {what} failed on {cleanup.get('failed_engine_id')}: {cleanup.get('error')}"
    engines = cleanup.get("engines") or []
    on = f" on {len(engines)} engines" if engines else ""
    if job.get("cleanup_state") in ("pending", "running"):
        return f"destroying {what}{on} in the background"
    return f"{what}{on}"


def describe_failure(job: dict[str, Any]) -> str:
    error = job.get("error") or {}
    if job.get("state") == "cancelled":
        where = f" during {error['phase']}" if error.get("phase") else ""
        return f"job {job.get('id')} was cancelled{where}: {error.get('message') or 'on request'}"
    message = error.get("message") or "no error recorded"
    where = " ".join(f"{k}={error[k]}" for k in ("phase", "engine_id", "type") if error.get(k))
    return f"job {job.get('id')} ended {job.get('state')}: {message}" + (f" ({where})" if where else "")
