"""Prometheus metrics at `/metrics`, on a registry of our own (not the process-global default one).

Label values are bounded sets (outcomes, phases, operations, decisions): never job ids. Counters are
per coordinator process; Prometheus sums them across coordinators. `jobs in progress` is read from the
database at scrape time, so it is right after a restart and with several coordinators.

Who calls what:
- `record_agent_call(operation, outcome)`: the coordinator's agent client, once per HTTP call;
- `observe_job_finished(...)`: the outbox dispatcher, once per terminal job event (exactly once
  across coordinators, because each outbox event is claimed by one);
- `record_webhook_delivery(outcome)`: the webhook delivery worker, once per attempt;
- `record_inbound_hook(source, decision)`: the inbound hook service, once per request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# `*_created` timestamp series double the output and no dashboard here reads them.
disable_created_metrics()
REGISTRY = CollectorRegistry(auto_describe=True)

# Seconds: commit windows are milliseconds on CPU, phases (prepare with weight transfer) can take minutes.
_DOWNTIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)

JOBS_FINISHED = Counter(
    "epctl_reconfiguration_jobs",
    "Reconfiguration jobs that reached a terminal state, by outcome and by who requested them.",
    ["outcome", "requested_by"],
    registry=REGISTRY,
)
JOBS_IN_PROGRESS = Gauge(
    "epctl_reconfiguration_jobs_in_progress",
    "Reconfiguration jobs not yet terminal, by state (read from the database at scrape time).",
    ["state"],
    registry=REGISTRY,
)
PHASE_DURATION = Histogram(
    "epctl_reconfiguration_phase_duration_seconds",
    "Wall time of each phase of a finished reconfiguration job.",
    ["phase"],
    buckets=_PHASE_BUCKETS,
    registry=REGISTRY,
)
DOWNTIME = Histogram(
    "epctl_reconfiguration_downtime_seconds",
    "A finished job's downtime: the union of its engines' paused intervals.",
    ["outcome"],
    buckets=_DOWNTIME_BUCKETS,
    registry=REGISTRY,
)
AGENT_CALLS = Counter(
    "epctl_agent_calls",
    "HTTP calls from the coordinator to engine agents, by operation and outcome.",
    ["operation", "outcome"],
    registry=REGISTRY,
)
WEBHOOK_DELIVERIES = Counter(
    "epctl_webhook_delivery_attempts",
    "Outbound webhook delivery attempts, by outcome (delivered, failed, gone, error).",
    ["outcome"],
    registry=REGISTRY,
)
INBOUND_HOOKS = Counter(
    "epctl_inbound_hook_requests",
    "Inbound autoscaler requests by source (generic, alertmanager) and decision (accepted/ignored/rejected).",
    ["source", "decision"],
    registry=REGISTRY,
)


def record_agent_call(operation: str, outcome: str) -> None:
    """One coordinator -> agent call. `operation`: prepare, sync, pause, switch, resume, abort, info,
    health, reconfig, cleanup...; `outcome`: ok, error, unreachable, timeout (keep both sets small)."""
    AGENT_CALLS.labels(operation=operation, outcome=outcome).inc()


def record_webhook_delivery(outcome: str) -> None:
    WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()


def record_inbound_hook(source: str, decision: str) -> None:
    INBOUND_HOOKS.labels(source=source, decision=decision).inc()


def observe_job_finished(
    *,
    outcome: str,
    requested_by: str,
    downtime_ms: float | None,
    phase_durations_s: Mapping[str, float],
) -> None:
    JOBS_FINISHED.labels(outcome=outcome, requested_by=requested_by).inc()
    if downtime_ms is not None:
        DOWNTIME.labels(outcome=outcome).observe(max(downtime_ms, 0.0) / 1000.0)
    for phase, seconds in phase_durations_s.items():
        PHASE_DURATION.labels(phase=phase).observe(max(seconds, 0.0))


def set_jobs_in_progress(counts_by_state: Mapping[str, int], known_states: list[str]) -> None:
    """Set the gauge for every non-terminal state (zero where none), so a finished state drops to 0."""
    for state in known_states:
        JOBS_IN_PROGRESS.labels(state=state).set(counts_by_state.get(state, 0))


def render() -> bytes:
    return generate_latest(REGISTRY)


def refresh_jobs_in_progress(request: Request) -> None:
    """Count non-terminal jobs by state in the coordinator's database (the app's `db_engine`)."""
    import sqlalchemy as sa
    from sqlmodel import Session

    from app.jobs.models import ReconfigurationJob
    from app.jobs.states import ACTIVE_STATES

    engine = getattr(request.app.state, "db_engine", None)
    if engine is None:
        return
    active = sorted(state.value for state in ACTIVE_STATES)
    state_column = ReconfigurationJob.__table__.c.state  # type: ignore[attr-defined]
    with Session(engine) as session:
        rows = session.execute(
            sa.select(state_column, sa.func.count()).where(state_column.in_(active)).group_by(state_column)
        ).all()
    set_jobs_in_progress({str(state): int(count) for state, count in rows}, active)


def build_router(refresh: Callable[[Request], None] | None = refresh_jobs_in_progress) -> APIRouter:
    """`GET /metrics`. `refresh(request)` runs before rendering (it reads in-progress jobs from the DB)."""
    router = APIRouter(tags=["metrics"])

    @router.get(
        "/metrics",
        operation_id="metrics-scrape",
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    )
    def scrape(request: Request) -> Response:
        """The coordinator's metrics in Prometheus' text format (no job ids as labels)."""
        if refresh is not None:
            refresh(request)
        return Response(render(), media_type=CONTENT_TYPE_LATEST)

    return router


router = build_router()
