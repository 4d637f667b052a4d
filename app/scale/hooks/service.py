"""Inbound autoscaler requests -> decisions (accepted / ignored / rejected) -> jobs. HTTP-free.

Every authenticated request leaves one `InboundHookRequest` row per deployment it names (a request
that cannot be read leaves one row too), with the decision and the reason, so an operator can see why
the fleet did or did not scale. A job and the record of the decision that created it are committed
together: a request either creates both or neither. Requests that fail authentication are counted
(`epctl_inbound_hook_requests{decision="rejected"}`) but never stored, so anonymous callers cannot
grow the database; `app.scale.hooks.intake` authenticates. A job is created only through
`app.jobs.service.create_reconfiguration`, with `requested_by = autoscaler`, so every rule of the API
(limits, one active job, unresolved cleanup) applies.

Deciding is `app.scale.hooks.decide`'s (the desired size, the cooldown, the job); this module records,
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
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app import metrics
from app.core.clock import utc_now
from app.core.errors import AuthenticationError, ConflictError, DomainError, InvalidRequestError
from app.core.ids import new_id
from app.deployments.models import Deployment
from app.scale.hooks.alertmanager import (
    MAX_DP_SIZE,
    AlertmanagerPayload,
    ScaleAsk,
    intent_stream_key,
    parse_step,
)
from app.scale.hooks.models import (
    INTENT_DECISIONS,
    HookDecision,
    HookOutcome,
    HookRequestList,
    HookRequestPublic,
    HookSource,
    InboundHookRequest,
)
from app.scale.intents import ScaleIntentRow
from app.webhooks.models import OUTBOX_ID_PREFIX, EventType, OutboxEvent

log = logging.getLogger(__name__)

HOOK_REQUEST_ID_PREFIX = "hook"
_REASON_LIMIT = 1000
_NAME_LIMIT = 63


# --- request and response shapes ---------------------------------------------------------------------


class ScaleRequest(BaseModel):
    """A generic scale request: an absolute `target_dp_size` or a relative `step` (exactly one), or with
    `status: resolved` the withdrawal of its group's standing intent (neither needed)."""

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
    group: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="the stream this intent belongs to (default: the sender): a group's newer request "
        "replaces its standing intent, and `status: resolved` withdraws it",
    )
    status: Literal["firing", "resolved"] = Field(
        "firing",
        description="resolved: withdraw the group's standing intent (its desired size, if not acted on yet)",
    )

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
        if self.status == "firing" and (self.target_dp_size is None) == (self.step is None):
            raise ValueError("give exactly one of target_dp_size and step")
        return self

    def ask(self, caller: Caller) -> ScaleAsk:
        """What it asks; its stream is its group, by default its sender."""
        stream = intent_stream_key("generic", self.group or f"sender:{caller.requester or ''}")
        return ScaleAsk(
            deployment=self.deployment,
            target_dp_size=None if self.status == "resolved" else self.target_dp_size,
            step=None if self.status == "resolved" else self.step,
            reason=self.reason or "generic scale hook",
            stream=stream,
            resolved=self.status == "resolved",
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
    intent_id: str | None = None,
    identity: str | None = None,
    duplicate_of: str | None = None,
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
        # A duplicate keeps neither unique key: the record it repeats holds them.
        webhook_id=caller.webhook_id if duplicate_of is None else None,
        identity=identity if duplicate_of is None else None,
        duplicate_of=duplicate_of,
        intent_id=intent_id,
        created_at=now or utc_now(),
    )


def announce(session: Session, row: InboundHookRequest) -> None:
    """A decision about an intent: the outbox event `autoscaler.decision` (in the caller's transaction)
    and its count. Duplicates and refused requests are neither announced nor counted here."""
    code = str((row.payload or {}).get("code", ""))
    if (
        row.intent_id is None
        or row.duplicate_of is not None
        or HookDecision(row.decision) not in INTENT_DECISIONS
    ):
        return
    metrics.record_autoscaler_decision(row.source, row.decision, code)
    session.add(
        OutboxEvent(
            id=new_id(OUTBOX_ID_PREFIX),
            type=EventType.autoscaler_decision.value,
            deployment_id=row.deployment_id,
            payload={
                "type": EventType.autoscaler_decision.value,
                "timestamp": row.created_at.isoformat(),
                "data": {
                    "request_id": row.id,
                    "deployment": row.deployment_name,
                    "source": row.source,
                    "decision": row.decision,
                    "code": code,
                    "reason": row.reason,
                    "requested_dp_size": row.requested_dp_size,
                    "target_dp_size": row.target_dp_size,
                    "intent_id": row.intent_id,
                    "job_id": row.job_id,
                    "requester": row.requester,
                    "origin": (row.payload or {}).get("origin", "request"),
                },
            },
            created_at=row.created_at,
        )
    )


def add_record(
    session: Session, caller: Caller, decision: HookDecision, code: str, reason: str, **fields: Any
) -> InboundHookRequest:
    """A record in the caller's transaction (announced if it is a decision about an intent)."""
    row = new_row(caller, decision, code, reason, **fields)
    session.add(row)
    announce(session, row)
    return row


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
        intent_id=row.intent_id,
        duplicate_of=row.duplicate_of,
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
    row = add_record(session, caller, decision, code, reason, **fields)
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
    """A request that failed authentication: counted, never stored (anonymous callers must not be able
    to grow the database), and summed up in the log with the other refused calls (the router's
    `AuthGuard`), not one line each."""
    metrics.record_inbound_hook(source.value, HookDecision.rejected.value)
    log.debug(
        "inbound %s hook refused before authentication: %s (%s)", source.value, error.code, error.detail
    )
    return error


def find_identity(session: Session, identity: str) -> InboundHookRequest | None:
    return session.exec(select(InboundHookRequest).where(InboundHookRequest.identity == identity)).first()


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
    intent_ids = {r.intent_id for r in rows if r.intent_id}
    found = (
        session.exec(select(ScaleIntentRow).where(col(ScaleIntentRow.id).in_(intent_ids))).all()
        if intent_ids
        else []
    )
    by_id = {i.id: i for i in found}

    def public(row: InboundHookRequest) -> HookRequestPublic:
        intent = by_id.get(row.intent_id or "")
        if intent is None:
            return HookRequestPublic.model_validate(row)
        # The job is the intent's when this record asked for it (not for a withdrawal or a duplicate).
        asked = intent.request_id == row.id
        return HookRequestPublic.of(
            row, intent_state=intent.state, job_id=row.job_id or (intent.job_id if asked else None)
        )

    return HookRequestList(data=[public(r) for r in rows], count=int(total))


def prune_hook_requests(session: Session, *, older_than: datetime) -> int:
    """Delete hook records created before `older_than` (retention); returns how many."""
    result = session.execute(
        sa.delete(InboundHookRequest).where(col(InboundHookRequest.created_at) < older_than)
    )
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
