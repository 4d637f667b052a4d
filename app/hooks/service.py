"""Inbound autoscaler requests -> decisions (accepted / ignored / rejected) -> jobs. HTTP-free.

Every authenticated request leaves one `InboundHookRequest` row per deployment it names (a request
that cannot be read leaves one row too), with the decision and the reason, so an operator can see why
the fleet did or did not scale. A job and the record of the decision that created it are committed
together: a request either creates both or neither. Requests that fail authentication are counted
(`epctl_inbound_hook_requests{decision="rejected"}`) but never stored, so anonymous callers cannot
grow the database; `app.hooks.intake` authenticates. A job is created only through
`app.jobs.service.create_reconfiguration`, with `requested_by = autoscaler`, so every rule of the API
(limits, one active job, unresolved cleanup) applies.

Deciding is `app.hooks.decide`'s (the desired size, the cooldown, the job); this module records,
parses and lists.

Storage notes: a signed request's verified `webhook-id` is the row's `webhook_id` column, unique, so
copies of one signed request are refused atomically (`ReplayedRequestError`); the Alertmanager dedupe
key lives in the row's `payload` JSON (`payload.dedupe_key`); lookups are bounded by time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app import metrics
from app.core.clock import utc_now
from app.core.errors import AuthenticationError, ConflictError, DomainError, InvalidRequestError
from app.core.ids import new_id
from app.deployments.models import Deployment
from app.hooks.alertmanager import MAX_DP_SIZE, AlertmanagerPayload, ScaleIntent, parse_step
from app.hooks.models import (
    HookDecision,
    HookOutcome,
    HookRequestList,
    HookRequestPublic,
    HookSource,
    InboundHookRequest,
)

log = logging.getLogger(__name__)

HOOK_REQUEST_ID_PREFIX = "hook"
_REASON_LIMIT = 1000
_NAME_LIMIT = 63


# --- request and response shapes ---------------------------------------------------------------------


class ScaleRequest(BaseModel):
    """A generic scale request: an absolute `target_dp_size` or a relative `step` (exactly one)."""

    model_config = ConfigDict(extra="forbid")

    deployment: str = Field(min_length=1, max_length=_NAME_LIMIT)
    target_dp_size: int | None = Field(None, ge=1, le=MAX_DP_SIZE, strict=True)
    step: int | None = Field(
        None,
        ge=-MAX_DP_SIZE,
        le=MAX_DP_SIZE,
        description='relative change: +N or -N (a number, or a string "+1"), at most 1024 either way',
    )
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


def new_row(
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
) -> InboundHookRequest:
    payload: dict[str, Any] = dict(details or {})
    payload["code"] = code
    if caller.webhook_id is not None:
        payload["webhook_id"] = caller.webhook_id
    name = deployment.name if deployment is not None else deployment_name
    return InboundHookRequest(
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
        webhook_id=caller.webhook_id,
        created_at=now or utc_now(),
    )


def outcome_of(row: InboundHookRequest) -> HookOutcome:
    metrics.record_inbound_hook(row.source, row.decision)
    return HookOutcome(
        request_id=row.id,
        decision=HookDecision(row.decision),
        code=str((row.payload or {}).get("code", "")),
        reason=row.reason,
        deployment=row.deployment_name,
        requested_dp_size=row.requested_dp_size,
        target_dp_size=row.target_dp_size,
        job_id=row.job_id,
        next_scale_at=(row.payload or {}).get("next_scale_at"),
    )


def record(
    session: Session,
    caller: Caller,
    decision: HookDecision,
    code: str,
    reason: str,
    **fields: Any,
) -> HookOutcome:
    """Write the request's row (committed) and count it; return what the API answers. A second record of
    one signed request (same webhook-id) is refused by the database: `ReplayedRequestError`."""
    row = new_row(caller, decision, code, reason, **fields)
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise replayed_error(session, caller) from None
    return outcome_of(row)


def replayed_error(session: Session, caller: Caller) -> DomainError:
    """The error for a signed request whose webhook-id is already recorded (re-raises otherwise)."""
    original = find_webhook_id(session, caller.webhook_id) if caller.webhook_id else None
    if original is None:
        raise  # not a replay: a genuine integrity failure
    metrics.record_inbound_hook(caller.source.value, HookDecision.rejected.value)
    return ReplayedRequestError(
        f"webhook-id {caller.webhook_id!r} was already received (request {original.id}): "
        "replays change nothing",
        original_request_id=original.id,
    )


def find_webhook_id(session: Session, webhook_id: str) -> InboundHookRequest | None:
    return session.exec(select(InboundHookRequest).where(InboundHookRequest.webhook_id == webhook_id)).first()


def reject(
    session: Session, caller: Caller, error: DomainError, *, deployment_name: str | None = None
) -> DomainError:
    """Record an authenticated caller's refused request and return the error to raise (it names the
    recorded request)."""
    outcome = record(
        session, caller, HookDecision.rejected, error.code, error.detail, deployment_name=deployment_name
    )
    error.extra["request_id"] = outcome.request_id
    return error


def refuse_anonymous(source: HookSource, error: DomainError) -> DomainError:
    """A request that failed authentication: counted, logged, never stored (anonymous callers must not
    be able to grow the database)."""
    metrics.record_inbound_hook(source.value, HookDecision.rejected.value)
    log.info("inbound %s hook refused before authentication: %s (%s)", source.value, error.code, error.detail)
    return error


def recorded_with(
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
    """The body as JSON. The request limits (`app.core.limits`) have already refused bodies too large,
    too deep or with numbers out of range; this still never lets a parse error become a 500."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedHookError(f"the body is not JSON: {str(exc)[:200]}") from None


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
    return HookRequestList(data=[HookRequestPublic.model_validate(r) for r in rows], count=int(total))


def prune_hook_requests(session: Session, *, older_than: datetime) -> int:
    """Delete hook records created before `older_than` (retention); returns how many."""
    result = session.execute(
        sa.delete(InboundHookRequest).where(col(InboundHookRequest.created_at) < older_than)
    )
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
