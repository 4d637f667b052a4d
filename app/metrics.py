"""Prometheus metrics at `/metrics`, on a registry of our own (not the process-global default one).

Names follow Prometheus' conventions (base units: `_seconds`, `_bytes`; counters end in `_total`; no
`_created` series), checked with `promtool check metrics` in the tests. Label values are bounded sets
(outcomes, phases, operations, decisions, route templates, deployment names): never job ids. Counters
are per coordinator process; Prometheus sums them across coordinators. Gauges of state (jobs in
progress, deployments, engines, webhook backlog) are read from the database at scrape time
(`app.metrics_db`), so they are right after a restart and with several coordinators.

Who calls what:
- `record_agent_call(operation, outcome)`: the coordinator's agent client, once per HTTP call;
- `observe_job_finished(...)`: the outbox dispatcher, once per terminal job event (exactly once
  across coordinators, because each outbox event is claimed by one);
- `record_webhook_delivery(outcome)`: the webhook delivery worker, once per attempt;
- `record_inbound_hook(source, decision)`: the inbound hook service, once per request;
- `record_autoscaler_decision(source, decision, code)`: the hook records, once per decision about an
  intent (taken, deferred, held, paused, withdrawn, superseded), at its request or later;
- `record_canaries(ok, late, failed)`: a job's canary probe (either backend), once when it stops;
- `record_front_door_requests(deployment, counted)`: the outbox dispatcher, once per terminal job event
  whose job has front-door accounting;
- `HttpMetrics`: an ASGI middleware, once per HTTP request (route template and status).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
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
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine_agent import build_info

# `*_created` timestamp series double the output and no dashboard here reads them.
disable_created_metrics()
REGISTRY = CollectorRegistry(auto_describe=True)
build_info.register(REGISTRY, "coordinator")  # process_*, python_info, epctl_build_info

# Seconds: commit windows are milliseconds on CPU, phases (prepare with weight transfer) can take minutes.
_DOWNTIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)

_JOB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0)
_HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

JOBS_FINISHED = Counter(
    "epctl_reconfiguration_jobs",
    "Reconfiguration jobs that reached a terminal state, by deployment, outcome and who requested them.",
    ["deployment", "outcome", "requested_by"],
    registry=REGISTRY,
)
JOB_DURATION = Histogram(
    "epctl_reconfiguration_job_duration_seconds",
    "Wall time of a finished reconfiguration job, from creation to its terminal state.",
    ["deployment", "outcome"],
    buckets=_JOB_BUCKETS,
    registry=REGISTRY,
)
DEPLOYMENT_DP_SIZE = Gauge(
    "epctl_deployment_dp_size",
    "A deployment's current DP size (engines in its serving generation).",
    ["deployment"],
    registry=REGISTRY,
)
DEPLOYMENT_DESIRED_DP_SIZE = Gauge(
    "epctl_deployment_desired_dp_size",
    "The DP size the next autoscaler move goes to (the current size when no intent is pending).",
    ["deployment"],
    registry=REGISTRY,
)
DEPLOYMENT_DESIRED_PENDING = Gauge(
    "epctl_deployment_desired_pending",
    "1 while an autoscaler intent of the deployment waits (active job, cooldown, pause, stabilization).",
    ["deployment"],
    registry=REGISTRY,
)
DEPLOYMENT_STATUS = Gauge(
    "epctl_deployment_status",
    "1 for the deployment's current status, 0 for the others.",
    ["deployment", "status"],
    registry=REGISTRY,
)
DEPLOYMENT_ENGINES = Gauge(
    "epctl_deployment_engines",
    "A deployment's known engines, by state (left engines are not counted).",
    ["deployment", "state"],
    registry=REGISTRY,
)
DEPLOYMENT_SPARES = Gauge(
    "epctl_deployment_spares",
    "A deployment's warm spares now (idle engines holding every expert, never members until needed).",
    ["deployment"],
    registry=REGISTRY,
)
DEPLOYMENT_SPARES_WANTED = Gauge(
    "epctl_deployment_spares_wanted",
    "The warm spares a deployment keeps (its `spares` setting).",
    ["deployment"],
    registry=REGISTRY,
)
WEBHOOK_BACKLOG = Gauge(
    "epctl_webhook_backlog_deliveries",
    "Webhook deliveries waiting to be sent (pending), by subscription and whether it is active.",
    ["subscription", "active"],
    registry=REGISTRY,
)
WEBHOOK_OLDEST_PENDING = Gauge(
    "epctl_webhook_oldest_pending_age_seconds",
    "Age of the oldest pending webhook delivery of each active subscription (0 when none).",
    ["subscription"],
    registry=REGISTRY,
)
HTTP_REQUESTS = Counter(
    "epctl_http_requests",
    "HTTP requests answered, by method, route template and status code.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "epctl_http_request_duration_seconds",
    "Time to answer an HTTP request (to its last body byte), by method and route template.",
    ["method", "route"],
    buckets=_HTTP_BUCKETS,
    registry=REGISTRY,
)
JOBS_IN_PROGRESS = Gauge(
    "epctl_reconfiguration_jobs_in_progress",
    "Reconfiguration jobs not yet terminal, by deployment and state (read from the database at scrape time).",
    ["deployment", "state"],
    registry=REGISTRY,
)
PHASE_DURATION = Histogram(
    "epctl_reconfiguration_phase_duration_seconds",
    "Wall time of each phase of a finished reconfiguration job, by deployment and the job's outcome.",
    ["deployment", "phase", "outcome"],
    buckets=_PHASE_BUCKETS,
    registry=REGISTRY,
)
DOWNTIME = Histogram(
    "epctl_reconfiguration_downtime_seconds",
    "A finished job's downtime: the union of its engines' paused intervals.",
    ["deployment", "outcome"],
    buckets=_DOWNTIME_BUCKETS,
    registry=REGISTRY,
)
FRONT_DOOR_REQUESTS = Counter(
    "epctl_front_door_requests",
    "Requests a finished job's deployment front door passed while the job ran (HAProxy's counters).",
    ["deployment"],
    registry=REGISTRY,
)
FRONT_DOOR_FAILED = Counter(
    "epctl_front_door_requests_failed",
    "Requests the front door failed while a job ran, by cause: 5xx (an answer of 5xx reached the client), "
    "connection (no engine could be reached), response (an engine broke its answer off).",
    ["deployment", "cause"],
    registry=REGISTRY,
)
FRONT_DOOR_DRAINED = Counter(
    "epctl_front_door_requests_drained",
    "Requests in flight on a job's leavers when the front door drained them (each finished there).",
    ["deployment"],
    registry=REGISTRY,
)
FRONT_DOOR_BY_SENDER = Counter(
    "epctl_front_door_requests_by_sender",
    "Requests a job's front door received while the job ran, by who sent them: clients (every request "
    "without the canary header) or canaries (the probe's).",
    ["deployment", "sender"],
    registry=REGISTRY,
)
CLIENT_OUTAGE = Histogram(
    "epctl_reconfiguration_client_outage_seconds",
    "A finished job's client outage, measured from outside by the canary probe: the longest stretch "
    "with no successful answer.",
    ["deployment", "outcome"],
    buckets=_DOWNTIME_BUCKETS,
    registry=REGISTRY,
)
CLIENT_SLOWEST_ANSWER = Histogram(
    "epctl_reconfiguration_client_slowest_answer_seconds",
    "A finished job's slowest answer to the canary probe: the longest latency of a canary that succeeded.",
    ["deployment", "outcome"],
    buckets=_DOWNTIME_BUCKETS,
    registry=REGISTRY,
)
PROBE_CANARIES = Counter(
    "epctl_probe_canaries",
    "Canary requests the probe sent to serving engines during jobs, by outcome (ok: answered within its "
    "deadline, late: answered after it, failed).",
    ["outcome"],
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
    "Outbound webhook delivery attempts, by outcome (delivered, failed, gone, error; not_queued: an event "
    "a disabled subscription's full backlog did not take).",
    ["outcome"],
    registry=REGISTRY,
)
AUTOSCALER_DECISIONS = Counter(
    "epctl_autoscaler_decisions",
    "Decisions about autoscaler intents, at their request or later by the coordinator: by source, "
    "decision (accepted, deferred, held, paused, withdrawn, superseded, ignored) and code.",
    ["source", "decision", "code"],
    registry=REGISTRY,
)
INBOUND_HOOKS = Counter(
    "epctl_inbound_hook_requests",
    "Inbound autoscaler requests by source (generic, alertmanager) and decision "
    "(accepted, deferred, ignored, rejected).",
    ["source", "decision"],
    registry=REGISTRY,
)


def record_agent_call(operation: str, outcome: str) -> None:
    """One coordinator -> agent call. `operation`: prepare, sync, pause, switch, resume, abort, info,
    health, reconfig, cleanup...; `outcome`: ok, error, unreachable, timeout (keep both sets small)."""
    AGENT_CALLS.labels(operation=operation, outcome=outcome).inc()


def agent_calls_total() -> float:
    """Every agent call this process counted so far (all operations and outcomes)."""
    return sum(
        sample.value
        for metric in AGENT_CALLS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def record_webhook_delivery(outcome: str) -> None:
    WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()


def record_inbound_hook(source: str, decision: str) -> None:
    INBOUND_HOOKS.labels(source=source, decision=decision).inc()


def record_autoscaler_decision(source: str, decision: str, code: str) -> None:
    """One decision about an intent (`code` is one of the bounded set in `app.scale.hooks.models`)."""
    AUTOSCALER_DECISIONS.labels(source=source, decision=decision, code=code).inc()


def observe_job_finished(
    *,
    outcome: str,
    requested_by: str,
    downtime_ms: float | None,
    phase_durations_s: Mapping[str, float],
    deployment: str = "",
    duration_s: float | None = None,
    client_outage_ms: float | None = None,
    client_slowest_answer_ms: float | None = None,
) -> None:
    JOBS_FINISHED.labels(deployment=deployment, outcome=outcome, requested_by=requested_by).inc()
    if duration_s is not None:
        JOB_DURATION.labels(deployment=deployment, outcome=outcome).observe(max(duration_s, 0.0))
    if downtime_ms is not None:
        DOWNTIME.labels(deployment=deployment, outcome=outcome).observe(max(downtime_ms, 0.0) / 1000.0)
    if client_outage_ms is not None:
        CLIENT_OUTAGE.labels(deployment=deployment, outcome=outcome).observe(
            max(client_outage_ms, 0.0) / 1000.0
        )
    if client_slowest_answer_ms is not None:
        slowest_s = max(client_slowest_answer_ms, 0.0) / 1000.0
        CLIENT_SLOWEST_ANSWER.labels(deployment=deployment, outcome=outcome).observe(slowest_s)
    for phase, seconds in phase_durations_s.items():
        PHASE_DURATION.labels(deployment=deployment, phase=phase, outcome=outcome).observe(max(seconds, 0.0))


def record_front_door_requests(deployment: str, counted: Mapping[str, Any]) -> None:
    """One finished job's requests at its deployment's front door (`front_door_requests`)."""
    FRONT_DOOR_REQUESTS.labels(deployment=deployment).inc(_count(counted.get("requests")))
    failed = counted.get("failed")
    for cause in ("5xx", "connection", "response"):  # a bounded set, each present (0 where none)
        n = _count(failed.get(cause)) if isinstance(failed, Mapping) else 0
        FRONT_DOOR_FAILED.labels(deployment=deployment, cause=cause).inc(n)
    drained = counted.get("drained")
    held = 0
    if isinstance(drained, Mapping):
        held = sum(_count(d.get("in_flight_at_drain")) for d in drained.values() if isinstance(d, Mapping))
    FRONT_DOOR_DRAINED.labels(deployment=deployment).inc(held)
    senders = counted.get("by_sender")
    for sender in ("clients", "canaries"):  # a bounded set, each present where the job counted them
        if isinstance(senders, Mapping) and isinstance(senders.get(sender), Mapping):
            n = _count(senders[sender].get("requests"))
            FRONT_DOOR_BY_SENDER.labels(deployment=deployment, sender=sender).inc(n)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def record_canaries(*, ok: int, late: int, failed: int) -> None:
    """One job's canaries, once the probe stopped."""
    PROBE_CANARIES.labels(outcome="ok").inc(ok)
    PROBE_CANARIES.labels(outcome="late").inc(late)
    PROBE_CANARIES.labels(outcome="failed").inc(failed)


def set_jobs_in_progress(
    counts: Mapping[tuple[str, str], int], deployments: list[str], known_states: list[str]
) -> None:
    """Set the gauge for every deployment and non-terminal state (zero where none), so a finished state
    drops to 0 and a deleted deployment's series disappear."""
    JOBS_IN_PROGRESS.clear()
    for deployment in deployments:
        for state in known_states:
            JOBS_IN_PROGRESS.labels(deployment=deployment, state=state).set(
                counts.get((deployment, state), 0)
            )


def render() -> bytes:
    return generate_latest(REGISTRY)


def build_router(refresh: Callable[[Request], None] | None = None) -> APIRouter:
    """`GET /metrics`. `refresh(request)` runs before rendering (`app.metrics_db.refresh` reads the gauges
    of state from the database)."""
    router = APIRouter(tags=["metrics"])

    @router.get(
        "/metrics",
        operation_id="metrics-scrape",
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    )
    async def scrape(request: Request) -> Response:
        """The coordinator's metrics in Prometheus' text format (no job ids as labels)."""
        if refresh is not None:
            database = getattr(request.app.state, "database", None)
            limiter = database.limiter if database is not None else None
            await anyio.to_thread.run_sync(refresh, request, limiter=limiter)
        return Response(render(), media_type=CONTENT_TYPE_LATEST)

    return router


def set_deployment_gauges(
    rows: list[tuple[str, int, int, bool, str]],
    engines: Mapping[tuple[str, str], int],
    statuses: list[str],
    engine_states: list[str],
) -> None:
    """Replace the deployment gauges: rows of (name, current, desired, pending, status); a deleted
    deployment's series disappear."""
    for gauge in (
        DEPLOYMENT_DP_SIZE,
        DEPLOYMENT_DESIRED_DP_SIZE,
        DEPLOYMENT_DESIRED_PENDING,
        DEPLOYMENT_STATUS,
    ):
        gauge.clear()
    DEPLOYMENT_ENGINES.clear()
    for name, current, desired, pending, status in rows:
        DEPLOYMENT_DP_SIZE.labels(deployment=name).set(current)
        DEPLOYMENT_DESIRED_DP_SIZE.labels(deployment=name).set(desired)
        DEPLOYMENT_DESIRED_PENDING.labels(deployment=name).set(1 if pending else 0)
        for known in statuses:
            DEPLOYMENT_STATUS.labels(deployment=name, status=known).set(1 if known == status else 0)
        for state in engine_states:
            DEPLOYMENT_ENGINES.labels(deployment=name, state=state).set(engines.get((name, state), 0))


def set_spare_gauges(spares: Mapping[str, tuple[int, int]]) -> None:
    """deployment name -> (spares now, spares wanted); a deleted deployment's series disappear."""
    DEPLOYMENT_SPARES.clear()
    DEPLOYMENT_SPARES_WANTED.clear()
    for name, (held, wanted) in spares.items():
        DEPLOYMENT_SPARES.labels(deployment=name).set(held)
        DEPLOYMENT_SPARES_WANTED.labels(deployment=name).set(wanted)


def set_webhook_backlog(pending: Mapping[tuple[str, bool], int], oldest_age_s: Mapping[str, float]) -> None:
    """`oldest_age_s`: every active subscription's oldest pending age (0 when none pending)."""
    WEBHOOK_BACKLOG.clear()
    for (subscription, active), count in pending.items():
        WEBHOOK_BACKLOG.labels(subscription=subscription, active=str(active).lower()).set(count)
    WEBHOOK_OLDEST_PENDING.clear()
    for subscription, age in oldest_age_s.items():
        WEBHOOK_OLDEST_PENDING.labels(subscription=subscription).set(max(age, 0.0))


class HttpMetrics:
    """ASGI middleware: counts every HTTP answer by method, route template (`/v1/deployments/{name}`,
    never the raw path: bounded) and status, and times it to the last body byte (streams included).
    Requests no route matched count as route `unmatched`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            key = (str(scope.get("method", "GET")), _route_of(scope), status[0])
            series = _SERIES.get(key)
            if series is None:  # the labelled children, looked up once per (method, route, status)
                method, route, code = key
                series = _SERIES[key] = (
                    HTTP_REQUESTS.labels(method=method, route=route, status=str(code)),
                    HTTP_DURATION.labels(method=method, route=route),
                )
            series[0].inc()
            series[1].observe(time.perf_counter() - started)


# Bounded as the labels are: route templates (never raw paths), the methods and statuses answered.
_SERIES: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def _route_of(scope: Scope) -> str:
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    raw = str(scope.get("path", ""))
    return "/ui" if raw.startswith("/ui") else "unmatched"
