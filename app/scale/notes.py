"""A hook record of a decision the coordinator took about an intent after the request that asked for it
(every decision is a record: a step, a retry, a supersession, an expiry, a hold lifted)."""

from __future__ import annotations

from sqlmodel import Session

from app.deployments.models import Deployment
from app.scale.hooks import service as records
from app.scale.hooks.models import HookDecision, HookSource
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
