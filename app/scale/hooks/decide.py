"""Inbound scale asks -> intents -> a job now, or later. HTTP-free.

Decision order for an ask: unknown deployment (rejected) -> a repeat of an identity already decided
(ignored `duplicate`, linked to the record it repeats; a signed request's identity is its webhook-id
and body) -> a withdrawal (`resolved`: the stream's standing intent is withdrawn if not acted on yet,
else it just stops standing) -> a new intent of its stream (clamped to [min, max]; it replaces the
stream's standing one), committed with its record -> what `app.scale.desired` says of it now: a job
(accepted), at its size (ignored), an active job or the cooldown (deferred), paused, or held by the
rule (window, a higher ask, the max step). Deferred, paused and held intents are acted on later by the
runner's reconciler, without a repeat.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationJob
from app.scale import desired, intents
from app.scale.blockers import base_size
from app.scale.hooks.alertmanager import (
    ScaleAsk,
)
from app.scale.hooks.models import HookDecision, HookOutcome, InboundHookRequest
from app.scale.hooks.service import (
    Caller,
    ReplayedRequestError,
    announce,
    find_identity,
    find_webhook_id,
    new_row,
    outcome_of,
    record,
)
from app.scale.intents import EndCode, IntentState, ScaleIntentRow


@dataclass(frozen=True)
class SizeDecision:
    requested: int
    target: int
    note: str  # how the target was reached, for the recorded reason


def resolve_size(ask: ScaleAsk, deployment: Deployment, base: int) -> SizeDecision:
    """Absolute or stepped (from `base`) size, clamped to the deployment's [min, max]."""
    if ask.target_dp_size is not None:
        requested = ask.target_dp_size
        how = f"target {requested}"
    else:
        assert ask.step is not None
        requested = base + ask.step
        how = f"step {ask.step:+d} from {base} = {requested}"
    target = min(max(requested, deployment.min_dp_size), deployment.max_dp_size)
    if target != requested:
        bound = "max" if requested > deployment.max_dp_size else "min"
        how += f", clamped to {bound} {target} (limits [{deployment.min_dp_size}, {deployment.max_dp_size}])"
    return SizeDecision(requested=requested, target=target, note=how)


def body_digest(document: Any) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()


def _original(session: Session, caller: Caller, ask: ScaleAsk) -> InboundHookRequest | None:
    """The record that decided this identity before, if any."""
    if ask.identity is not None:
        return find_identity(session, ask.identity)
    if caller.webhook_id is not None:
        return find_webhook_id(session, caller.webhook_id)
    return None


def _duplicate(
    session: Session,
    caller: Caller,
    deployment: Deployment,
    original: InboundHookRequest,
    details: dict[str, Any],
    now: datetime,
) -> HookOutcome:
    digest = details.get("body_sha256")
    if digest is not None and (original.payload or {}).get("body_sha256") != digest:
        outcome = record(
            session,
            caller,
            HookDecision.rejected,
            ReplayedRequestError.code,
            f"webhook-id {caller.webhook_id!r} was already received with another body (request "
            f"{original.id}): nothing changes",
            deployment=deployment,
            duplicate_of=original.id,
            details=details,
            now=now,
        )
        raise ReplayedRequestError(
            outcome.reason, original_request_id=original.id, request_id=outcome.request_id
        )
    if original.intent_id is not None:
        intent = session.get(ScaleIntentRow, original.intent_id)
        if intent is not None and intent.state in intents.STANDING:
            intent.last_seen_at = now  # a repeat keeps its intent from expiring
            session.add(intent)
    code = str((original.payload or {}).get("code", ""))
    return record(
        session,
        caller,
        HookDecision.ignored,
        "duplicate",
        f"repeat of request {original.id} ({original.decision}, {code}): decided once",
        deployment=deployment,
        duplicate_of=original.id,
        intent_id=original.intent_id,
        details=details,
        now=now,
    )


def withdraw(
    session: Session,
    caller: Caller,
    deployment: Deployment,
    ask: ScaleAsk,
    details: dict[str, Any],
    now: datetime,
    code: EndCode = EndCode.resolved,
) -> HookOutcome:
    standing = intents.standing_in_stream(session, deployment.id, ask.stream)
    row = new_row(
        caller,
        HookDecision.ignored,
        code.value,
        f"{ask.reason}: no intent of this group stands for {deployment.name}, nothing to withdraw",
        deployment=deployment,
        identity=ask.identity,
        intent_id=standing.id if standing is not None else None,
        details=details,
        now=now,
    )
    if standing is not None and standing.state == IntentState.pending.value:
        row.decision = HookDecision.withdrawn.value
        row.target_dp_size = standing.target_dp_size
        row.reason = (
            f"{ask.reason}: desired size {standing.target_dp_size} of intent {standing.id} (request "
            f"{standing.request_id}) withdrawn before it was acted on"
        )
    elif standing is not None:
        row.reason = (
            f"{ask.reason}: intent {standing.id} was already acted on"
            + (f" (job {standing.job_id})" if standing.job_id else " (the deployment was at its size)")
            + "; it stops standing: nothing is undone"
        )
    if standing is not None:
        intents.end(standing, code, by=row.id, now=now)
        session.add(standing)
    session.add(row)
    announce(session, row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        original = _original(session, caller, ask)
        if original is None:
            raise
        return _duplicate(session, caller, deployment, original, details, now)
    return outcome_of(row)


def decide(
    session: Session,
    caller: Caller,
    ask: ScaleAsk,
    *,
    details: Mapping[str, Any] | None = None,
    deployment: Deployment | None = None,
    now: datetime | None = None,
) -> HookOutcome:
    """Decide one ask: a record (and an intent) always, a job when the rule says so. Never raises for a
    decision (a signed webhook-id reused with another body raises `ReplayedRequestError`)."""
    now = now or utc_now()
    details = dict(details or {})
    if deployment is None:
        deployment = session.exec(select(Deployment).where(col(Deployment.name) == ask.deployment)).first()
    if deployment is None:
        return record(
            session,
            caller,
            HookDecision.rejected,
            "unknown-deployment",
            f"no deployment named {ask.deployment!r}",
            deployment_name=ask.deployment,
            details=details,
            now=now,
        )
    original = _original(session, caller, ask)
    if original is not None:
        return _duplicate(session, caller, deployment, original, details, now)
    if ask.resolved:
        return withdraw(session, caller, deployment, ask, details, now)
    return _new_intent(session, caller, deployment, ask, details, now)


def _new_intent(
    session: Session,
    caller: Caller,
    deployment: Deployment,
    ask: ScaleAsk,
    details: dict[str, Any],
    now: datetime,
    *,
    refused: str | None = None,
) -> HookOutcome:
    """The intent, its request's record and the end of the stream's previous intent, in one
    transaction with what the rule does now (a job commits with them). `refused`: a first attempt's
    job was refused; record the intent as deferred for that reason, without acting."""
    previous = intents.standing_in_stream(session, deployment.id, ask.stream)
    anchor: int | None = None
    if ask.step is not None:
        continues = ask.anchored and previous is not None and previous.anchor_dp_size is not None
        anchor = previous.anchor_dp_size if continues and previous else base_size(session, deployment)
    size = resolve_size(ask, deployment, anchor if anchor is not None else deployment.current_dp_size)
    intent = intents.new_intent(
        deployment_id=deployment.id,
        source=caller.source.value,
        stream=ask.stream,
        target=size.target,
        requested=size.requested,
        step=ask.step,
        anchor=anchor,
        requester=caller.requester,
        reason=ask.reason,
        now=now,
    )
    row = new_row(
        caller,
        HookDecision.deferred,
        "job-refused",
        f"desired size {size.target} recorded ({size.note}; {ask.reason}); job not created yet: {refused}",
        deployment=deployment,
        identity=ask.identity,
        intent_id=intent.id,
        details=details,
        now=now,
        requested=size.requested,
        target=size.target,
    )
    intent.request_id = row.id
    session.add(intent)
    session.add(row)
    if previous is not None:
        was_pending = previous.state == IntentState.pending.value
        intents.end(previous, EndCode.replaced, by=row.id, now=now)
        session.add(previous)
        if was_pending:
            desired.note(
                session,
                deployment,
                previous,
                HookDecision.superseded,
                EndCode.replaced.value,
                f"desired size {previous.target_dp_size} replaced by its group's newer intent {intent.id}",
            )
    try:
        # The unique identity (or webhook-id) makes copies sent at once duplicates of one decision:
        # a second copy's insert waits for the first to commit, then fails here.
        session.flush()
    except IntegrityError:
        session.rollback()
        original = _original(session, caller, ask)
        if original is None:
            raise
        return _duplicate(session, caller, deployment, original, details, now)
    if refused is not None:
        announce(session, row)
        session.commit()
        return outcome_of(row)
    outcome = _act_on(session, deployment, intent, row, size, now)
    if isinstance(outcome, str):  # the job was refused, and the rollback took the intent with it
        return _new_intent(session, caller, deployment, ask, details, now, refused=outcome)
    return outcome


def _act_on(
    session: Session,
    deployment: Deployment,
    intent: ScaleIntentRow,
    row: InboundHookRequest,
    size: SizeDecision,
    now: datetime,
) -> HookOutcome | str:
    """Decide the new intent's record and act (committing both); why, if its job was refused."""
    assessment = desired.assess(session, deployment, now)
    outlook = assessment.outlook(intent)
    from_size = deployment.current_dp_size

    def finalize(decision: HookDecision, code: str, reason: str, until: datetime | None = None) -> None:
        row.decision = decision.value
        row.reason = reason[:1000]
        payload = {**(row.payload or {}), "code": code}
        if until is not None:
            payload["next_scale_at"] = until.isoformat()
        row.payload = payload
        session.add(row)
        announce(session, row)

    if outlook.decision is not HookDecision.accepted:
        reason = f"{outlook.reason} ({size.note}; {intent.reason})"
        finalize(outlook.decision, outlook.code, reason, outlook.until)
        if intent.id in assessment.verdict.at_size:
            intents.mark_acted(intent, job_id=None, now=now)
            session.add(intent)
        session.commit()  # ours first: a job the rule starts for other intents may be refused
        outcome = outcome_of(row)
        desired.act(session, assessment, own=intent.id)
        return outcome

    def accepted(session: Session, job: ReconfigurationJob) -> None:
        row.job_id = job.id
        step = job.to_dp_size != intent.target_dp_size  # a rate policy's step: more follow
        verb = f"stepping toward {intent.target_dp_size}" if step else "scaling"
        reason = f"{verb} {from_size} -> {job.to_dp_size}: {size.note} ({intent.reason})"
        finalize(HookDecision.accepted, "stepping" if step else "scaling", reason)

    acted = desired.act(session, assessment, own=intent.id, on_created=accepted)
    if acted.job is None:
        return acted.refused or "refused"
    return outcome_of(row)
