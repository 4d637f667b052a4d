"""A hook record of a decision the coordinator took about an intent after the request that asked for it
(every decision is a record: a step, a retry, a supersession, an expiry, a hold lifted)."""

from __future__ import annotations

from sqlmodel import Session, col, select

from app.deployments.models import Deployment
from app.scale.hooks import service as records
from app.scale.hooks.models import HookDecision, HookSource, InboundHookRequest
from app.scale.intents import ScaleIntentRow

_HOOK_SOURCES = {source.value for source in HookSource}


def note(
    session: Session,
    deployment: Deployment,
    intent: ScaleIntentRow,
    decision: HookDecision,
    code: str,
    reason: str,
    *,
    job_id: str | None = None,
) -> None:
    """A hook record of a decision the coordinator took about an intent after its request (the
    request's own record is the intake's to write)."""
    source = HookSource(intent.source) if intent.source in _HOOK_SOURCES else HookSource.generic
    records.add_record(
        session,
        records.Caller(source, requester=intent.requester),
        decision,
        code,
        f"{reason} (intent {intent.id}, asked by request {intent.request_id})",
        deployment=deployment,
        intent_id=intent.id,
        target=intent.target_dp_size,
        requested=intent.requested_dp_size,
        job_id=job_id,
        details={"origin": "coordinator"},
    )


def last_decision(session: Session, intent_id: str) -> tuple[str, str] | None:
    """The (decision, code) of the newest record about an intent (duplicates aside)."""
    row = session.exec(
        select(InboundHookRequest)
        .where(col(InboundHookRequest.intent_id) == intent_id, col(InboundHookRequest.duplicate_of).is_(None))
        .order_by(col(InboundHookRequest.created_at).desc(), col(InboundHookRequest.id).desc())
        .limit(1)
    ).first()
    return (row.decision, str((row.payload or {}).get("code", ""))) if row is not None else None


def note_change(
    session: Session,
    deployment: Deployment,
    intent: ScaleIntentRow,
    decision: HookDecision,
    code: str,
    reason: str,
) -> bool:
    """A record when what holds a pending intent back is no longer what its newest record says (deferred
    for the cooldown, then held by a higher intent: two decisions, two records); the caller commits."""
    if last_decision(session, intent.id) == (decision.value, code):
        return False
    note(session, deployment, intent, decision, code, reason)
    return True
