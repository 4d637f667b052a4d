"""Inbound autoscaler requests -> decisions (accepted / ignored / rejected) -> jobs. HTTP-free.

Every request leaves one `InboundHookRequest` row per deployment it names (a request that cannot be
read or authenticated leaves one row too), with the decision and the reason, so an operator can see why
the fleet did or did not scale. A job is created only through `app.jobs.service.create_reconfiguration`,
with `requested_by = autoscaler`, so every rule of the API (limits, one active job, unresolved
cleanup) applies.

Decision order for an intent: unknown deployment (rejected) -> duplicate Alertmanager notification
(ignored) -> active job (ignored) -> cooldown (ignored) -> clamp to [min, max] -> already at that size
(ignored) -> create the job (accepted; a refusal by the job service is ignored with its reason).

Storage notes: the verified `webhook-id` and the Alertmanager dedupe key live in the row's `payload`
JSON (`payload.webhook_id`, `payload.dedupe_key`); lookups are bounded by time, so they stay cheap.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlmodel import Session, col, select

from app import metrics
from app.core.clock import utc_now
from app.core.config import Settings
from app.core.errors import AuthenticationError, ConflictError, DomainError, InvalidRequestError
from app.core.ids import new_id
from app.deployments.models import Deployment
from app.hooks.alertmanager import AlertmanagerPayload, ScaleIntent, parse_step, plan
from app.hooks.models import HookDecision, HookSource, InboundHookRequest
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import active_job, create_reconfiguration
from app.webhooks import signing

log = logging.getLogger(__name__)

HOOK_REQUEST_ID_PREFIX = "hook"
_REASON_LIMIT = 1000
_NAME_LIMIT = 63


# --- request and response shapes ---------------------------------------------------------------------


class ScaleRequest(BaseModel):
    """A generic scale request: an absolute `target_dp_size` or a relative `step` (exactly one)."""

    model_config = ConfigDict(extra="forbid")

    deployment: str = Field(min_length=1, max_length=_NAME_LIMIT)
    target_dp_size: int | None = Field(None, ge=1, le=1024)
    step: int | None = Field(None, description='relative change: +N or -N (a number, or a string "+1")')
    reason: str | None = Field(None, max_length=500)

    @field_validator("step", mode="before")
    @classmethod
    def _signed_step(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_step(value)
        if isinstance(value, bool):
            raise ValueError("step must be a number such as +1 or -1")
        if value == 0:
            raise ValueError("step must not be zero")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> ScaleRequest:
        if (self.target_dp_size is None) == (self.step is None):
            raise ValueError("give exactly one of target_dp_size and step")
        return self

    def intent(self) -> ScaleIntent:
        return ScaleIntent(
            deployment=self.deployment,
            target_dp_size=self.target_dp_size,
            step=self.step,
            reason=self.reason or "generic scale hook",
        )


class HookOutcome(BaseModel):
    request_id: str = Field(description="the recorded request (see GET /v1/hooks/requests)")
    decision: HookDecision
    code: str = Field(
        description="why, as a slug: scaling, duplicate, active-job, cooldown, already-at-size, job-refused, "
        "unknown-deployment, alert-skipped, or the problem code of a refused request"
    )
    reason: str
    deployment: str | None
    requested_dp_size: int | None
    target_dp_size: int | None
    job_id: str | None


class AlertmanagerOutcome(BaseModel):
    results: list[HookOutcome] = Field(
        description="one per deployment named, and per group of skipped alerts"
    )


class HookRequestPublic(BaseModel):
    id: str
    source: HookSource
    decision: HookDecision
    reason: str
    deployment: str | None
    deployment_id: str | None
    requested_dp_size: int | None
    target_dp_size: int | None
    job_id: str | None
    requester: str | None
    details: dict[str, Any] | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: InboundHookRequest) -> HookRequestPublic:
        return cls(
            id=row.id,
            source=HookSource(row.source),
            decision=HookDecision(row.decision),
            reason=row.reason,
            deployment=row.deployment_name,
            deployment_id=row.deployment_id,
            requested_dp_size=row.requested_dp_size,
            target_dp_size=row.target_dp_size,
            job_id=row.job_id,
            requester=row.requester,
            details=row.payload,
            created_at=row.created_at,
        )


class HookRequestList(BaseModel):
    data: list[HookRequestPublic]
    count: int = Field(description="requests matching the filters, over all pages")


# --- errors ------------------------------------------------------------------------------------------


class HookSignatureError(AuthenticationError):
    """Bad, missing or stale signature: 401 problem+json; `code` says which."""


class ReplayedRequestError(ConflictError):
    code = "replayed-webhook-id"
    title = "Replayed request"


class MalformedHookError(InvalidRequestError):
    code = "malformed-hook-body"
    title = "Malformed hook body"


# --- recording ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """Who sent the request, as far as it could be established."""

    source: HookSource
    requester: str | None
    webhook_id: str | None = None


def _storable(value: Any) -> Any:
    """Postgres text and JSON refuse NUL characters; a hostile body may carry them in any string."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, Mapping):
        return {_storable(key): _storable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(item) for item in value]
    return value


def record(
    session: Session,
    caller: Caller,
    decision: HookDecision,
    code: str,
    reason: str,
    *,
    deployment_name: str | None = None,
    deployment: Deployment | None = None,
    requested: int | None = None,
    target: int | None = None,
    job_id: str | None = None,
    details: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> HookOutcome:
    """Write the request's row (committed) and count it; return what the API answers."""
    payload: dict[str, Any] = dict(details or {})
    payload["code"] = code
    if caller.webhook_id is not None:
        payload["webhook_id"] = caller.webhook_id
    name = deployment.name if deployment is not None else deployment_name
    row = InboundHookRequest(
        id=new_id(HOOK_REQUEST_ID_PREFIX),
        source=caller.source.value,
        deployment_name=_storable(name[:_NAME_LIMIT]) if name else None,
        deployment_id=deployment.id if deployment is not None else None,
        requested_dp_size=requested,
        target_dp_size=target,
        decision=decision.value,
        reason=_storable(reason[:_REASON_LIMIT]),
        job_id=job_id,
        requester=_storable(caller.requester),
        payload=_storable(payload) or None,
        created_at=now or utc_now(),
    )
    session.add(row)
    session.commit()
    metrics.record_inbound_hook(caller.source.value, decision.value)
    return HookOutcome(
        request_id=row.id,
        decision=decision,
        code=code,
        reason=row.reason,
        deployment=row.deployment_name,
        requested_dp_size=requested,
        target_dp_size=target,
        job_id=job_id,
    )


def reject(
    session: Session, caller: Caller, error: DomainError, *, deployment_name: str | None = None
) -> DomainError:
    """Record a refused request and return the error to raise (it names the recorded request)."""
    outcome = record(
        session, caller, HookDecision.rejected, error.code, error.detail, deployment_name=deployment_name
    )
    error.extra["request_id"] = outcome.request_id
    return error


# --- authentication by signature ---------------------------------------------------------------------


def inbound_secrets(settings: Settings, deployment_name: str | None) -> list[tuple[str, str]]:
    """(scope, secret) pairs that may sign a request for this deployment: its own, then the global one."""
    found: list[tuple[str, str]] = []
    if deployment_name and deployment_name in settings.hooks_inbound_secrets:
        found.append(("deployment", settings.hooks_inbound_secrets[deployment_name].get_secret_value()))
    if settings.hooks_inbound_secret is not None:
        found.append(("global", settings.hooks_inbound_secret.get_secret_value()))
    return found


def verify_signature(
    session: Session,
    settings: Settings,
    *,
    headers: Mapping[str, str],
    body: bytes,
    deployment_name: str | None,
    now: float | None = None,
) -> Caller:
    """Check a Standard Webhooks signature and that its webhook-id is new; the caller it establishes.
    Raises (after recording the refusal) HookSignatureError (401) or ReplayedRequestError (409)."""
    unverified = Caller(HookSource.generic, requester=None)
    candidates = inbound_secrets(settings, deployment_name)
    if not candidates:
        raise reject(
            session,
            unverified,
            HookSignatureError(
                "signed scale requests are not configured: set EPCTL_HOOKS_INBOUND_SECRET (or a "
                "per-deployment secret in EPCTL_HOOKS_INBOUND_SECRETS), or send a bearer token",
                code="signing-not-configured",
            ),
            deployment_name=deployment_name,
        )
    matched_scope: str | None = None
    try:
        for scope, secret in candidates:
            try:
                message_id, _ = signing.verify(
                    [secret], headers, body, now=now, tolerance_s=settings.hooks_signature_tolerance_s
                )
                matched_scope = scope
                break
            except signing.BadSignature:
                continue
            except signing.InvalidSecret:
                log.error("the %s inbound hook secret is not a whsec_ (base64) secret", scope)
                continue
        if matched_scope is None:
            raise signing.BadSignature("no signature matches a configured secret")
    except signing.SignatureError as exc:
        raise reject(
            session,
            unverified,
            HookSignatureError(str(exc), code=exc.reason),
            deployment_name=deployment_name,
        ) from None
    caller = Caller(HookSource.generic, requester=f"signature:{matched_scope}", webhook_id=message_id)
    window_start = utc_now() - timedelta(seconds=2 * settings.hooks_signature_tolerance_s)
    seen = _recorded_with(session, "webhook_id", message_id, since=window_start, source=HookSource.generic)
    if seen is not None:
        raise reject(
            session,
            Caller(HookSource.generic, requester=caller.requester),
            ReplayedRequestError(
                f"webhook-id {message_id!r} was already received (request {seen.id}): replays change nothing",
                original_request_id=seen.id,
            ),
            deployment_name=deployment_name,
        )
    return caller


def _recorded_with(
    session: Session,
    key: str,
    value: str,
    *,
    since: datetime,
    source: HookSource,
    deployment_id: str | None = None,
    decision: HookDecision | None = None,
) -> InboundHookRequest | None:
    payload = col(InboundHookRequest.payload)
    conditions: list[Any] = [
        col(InboundHookRequest.source) == source.value,
        col(InboundHookRequest.created_at) >= since,
        payload[key].as_string() == value,
    ]
    if deployment_id is not None:
        conditions.append(col(InboundHookRequest.deployment_id) == deployment_id)
    if decision is not None:
        conditions.append(col(InboundHookRequest.decision) == decision.value)
    return session.exec(
        select(InboundHookRequest).where(*conditions).order_by(col(InboundHookRequest.created_at).desc())
    ).first()


# --- parsing -----------------------------------------------------------------------------------------


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedHookError(f"the body is not JSON: {exc}") from None


def deployment_named_in(document: Any) -> str | None:
    """The deployment a generic body names, read before verification only to pick its secret."""
    if isinstance(document, dict) and isinstance(document.get("deployment"), str):
        return str(document["deployment"])[:_NAME_LIMIT]
    return None


def validation_summary(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors()[:5]
    )


def parse_scale_request(document: Any) -> ScaleRequest:
    try:
        return ScaleRequest.model_validate(document)
    except ValidationError as exc:
        raise MalformedHookError(f"not a scale request: {validation_summary(exc)}") from None


def parse_alertmanager(document: Any) -> AlertmanagerPayload:
    try:
        return AlertmanagerPayload.model_validate(document)
    except ValidationError as exc:
        raise MalformedHookError(
            f"not an Alertmanager webhook (version 4) payload: {validation_summary(exc)}"
        ) from None


# --- deciding ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SizeDecision:
    requested: int
    target: int
    note: str  # how the target was reached, for the recorded reason


def resolve_size(intent: ScaleIntent, deployment: Deployment) -> SizeDecision:
    """Absolute or stepped size, clamped to the deployment's [min, max]."""
    current = deployment.current_dp_size
    if intent.target_dp_size is not None:
        requested = intent.target_dp_size
        how = f"target {requested}"
    else:
        assert intent.step is not None
        requested = current + intent.step
        how = f"step {intent.step:+d} from {current} = {requested}"
    target = min(max(requested, deployment.min_dp_size), deployment.max_dp_size)
    if target != requested:
        bound = "max" if requested > deployment.max_dp_size else "min"
        how += f", clamped to {bound} {target} (limits [{deployment.min_dp_size}, {deployment.max_dp_size}])"
    return SizeDecision(requested=requested, target=target, note=how)


def cooldown_remaining_s(session: Session, deployment: Deployment, now: datetime) -> tuple[float, str | None]:
    """Seconds left in the deployment's autoscale cooldown after its last autoscaler job, and that job."""
    if deployment.autoscale_cooldown_s <= 0:
        return 0.0, None
    last = session.exec(
        select(ReconfigurationJob)
        .where(
            col(ReconfigurationJob.deployment_id) == deployment.id,
            col(ReconfigurationJob.requested_by) == RequestSource.autoscaler.value,
        )
        .order_by(col(ReconfigurationJob.created_at).desc())
        .limit(1)
    ).first()
    if last is None:
        return 0.0, None
    since = last.finished_at or last.created_at
    remaining = deployment.autoscale_cooldown_s - (now - since).total_seconds()
    return max(remaining, 0.0), last.id


def decide(
    session: Session,
    caller: Caller,
    intent: ScaleIntent,
    *,
    settings: Settings,
    details: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> HookOutcome:
    """Act on one intent: create the job or record why not. Never raises for a decision."""
    now = now or utc_now()
    details = {**(details or {}), **({"dedupe_key": intent.dedupe_key} if intent.dedupe_key else {})}
    deployment = session.exec(select(Deployment).where(col(Deployment.name) == intent.deployment)).first()
    if deployment is None:
        return record(
            session,
            caller,
            HookDecision.rejected,
            "unknown-deployment",
            f"no deployment named {intent.deployment!r}",
            deployment_name=intent.deployment,
            details=details,
            now=now,
        )

    def note(decision: HookDecision, code: str, reason: str, **fields: Any) -> HookOutcome:
        return record(
            session, caller, decision, code, reason, deployment=deployment, details=details, now=now, **fields
        )

    if intent.dedupe_key is not None:
        window_start = now - timedelta(seconds=settings.hooks_dedupe_window_s)
        earlier = _recorded_with(
            session,
            "dedupe_key",
            intent.dedupe_key,
            since=window_start,
            source=caller.source,
            deployment_id=deployment.id,
            decision=HookDecision.accepted,
        )
        if earlier is not None:
            return note(
                HookDecision.ignored,
                "duplicate",
                f"duplicate notification: this alert group and firing episode already scaled "
                f"(request {earlier.id}, job {earlier.job_id})",
            )
    running = active_job(session, deployment_id=deployment.id)
    if running is not None:
        return note(
            HookDecision.ignored, "active-job", f"reconfiguration {running.id} is still {running.state}"
        )
    remaining, last_job = cooldown_remaining_s(session, deployment, now)
    if remaining > 0:
        return note(
            HookDecision.ignored,
            "cooldown",
            f"cooldown: {remaining:.0f} s of {deployment.autoscale_cooldown_s:g} s left since autoscaler "
            f"job {last_job}",
        )
    size = resolve_size(intent, deployment)
    if size.target == deployment.current_dp_size:
        return note(
            HookDecision.ignored,
            "already-at-size",
            f"already at DP size {size.target} ({size.note})",
            requested=size.requested,
            target=size.target,
        )
    reason = f"{intent.reason} ({size.note})"
    try:
        outcome = create_reconfiguration(
            session,
            request=ReconfigurationCreate(
                deployment=deployment.name, target_dp_size=size.target, reason=reason[:1000]
            ),
            requested_by=RequestSource.autoscaler,
            requester=caller.requester,
        )
    except DomainError as exc:
        session.rollback()
        decision = HookDecision.ignored if isinstance(exc, ConflictError) else HookDecision.rejected
        return note(
            decision,
            "job-refused",
            f"job not created: {exc.detail}",
            requested=size.requested,
            target=size.target,
        )
    return note(
        HookDecision.accepted,
        "scaling",
        f"scaling {deployment.current_dp_size} -> {size.target}: {size.note} ({intent.reason})",
        requested=size.requested,
        target=size.target,
        job_id=outcome.job.id,
    )


def handle_alertmanager(
    session: Session, caller: Caller, payload: AlertmanagerPayload, *, settings: Settings
) -> AlertmanagerOutcome:
    """One result per deployment the firing alerts name, plus one per (deployment, reason) skipped."""
    result = plan(payload)
    context = {"group_key": payload.groupKey, "receiver": payload.receiver, "status": payload.status}
    outcomes = [
        decide(session, caller, intent, settings=settings, details=context) for intent in result.intents
    ]
    grouped: dict[tuple[str | None, str], list[str]] = {}
    for skipped in result.skipped:
        grouped.setdefault((skipped.deployment, skipped.reason), []).extend(skipped.fingerprints)
    for (deployment_name, reason), alerts in grouped.items():
        outcomes.append(
            record(
                session,
                caller,
                HookDecision.ignored,
                "alert-skipped",
                reason,
                deployment_name=deployment_name,
                details={**context, "alerts": alerts},
            )
        )
    return AlertmanagerOutcome(results=outcomes)


# --- reading -----------------------------------------------------------------------------------------


def list_requests(
    session: Session,
    *,
    deployment: str | None = None,
    decision: HookDecision | None = None,
    source: HookSource | None = None,
    limit: int = 50,
    offset: int = 0,
) -> HookRequestList:
    conditions: list[Any] = []
    if deployment is not None:
        conditions.append(col(InboundHookRequest.deployment_name) == deployment)
    if decision is not None:
        conditions.append(col(InboundHookRequest.decision) == decision.value)
    if source is not None:
        conditions.append(col(InboundHookRequest.source) == source.value)
    total = session.execute(
        sa.select(sa.func.count()).select_from(InboundHookRequest).where(*conditions)
    ).scalar_one()
    rows = session.exec(
        select(InboundHookRequest)
        .where(*conditions)
        .order_by(col(InboundHookRequest.created_at).desc(), col(InboundHookRequest.id).desc())
        .offset(offset)
        .limit(limit)
    ).all()
    return HookRequestList(data=[HookRequestPublic.from_row(r) for r in rows], count=int(total))
