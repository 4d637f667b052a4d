"""Inbound scale intents -> the deployment's desired size -> a job now, or later. HTTP-free.

Decision order for an intent: unknown deployment (rejected) -> duplicate Alertmanager notification
(ignored) -> clamp to [min, max] (a step counts from an active job's target, else the current size)
-> the desired size is recorded (`app.scale.desired`) -> already at that size (ignored) -> active job
or cooldown (deferred: the runner's reconciler acts once nothing blocks, without a repeat) -> create
the job (accepted; a refusal by the job service is deferred with its reason).

The cooldown counts from the deployment's newest job of any source, operator scaling included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.config import Settings
from app.core.errors import DomainError
from app.deployments.models import Deployment
from app.hooks.alertmanager import AlertmanagerPayload, ScaleIntent, plan
from app.hooks.models import AlertmanagerOutcome, HookDecision, HookOutcome, InboundHookRequest
from app.hooks.service import Caller, new_row, outcome_of, record, recorded_with, replayed_error
from app.jobs.models import ReconfigurationJob
from app.scale import desired


@dataclass(frozen=True)
class SizeDecision:
    requested: int
    target: int
    note: str  # how the target was reached, for the recorded reason


def resolve_size(intent: ScaleIntent, deployment: Deployment, base: int) -> SizeDecision:
    """Absolute or stepped (from `base`) size, clamped to the deployment's [min, max]."""
    if intent.target_dp_size is not None:
        requested = intent.target_dp_size
        how = f"target {requested}"
    else:
        assert intent.step is not None
        requested = base + intent.step
        how = f"step {intent.step:+d} from {base} = {requested}"
    target = min(max(requested, deployment.min_dp_size), deployment.max_dp_size)
    if target != requested:
        bound = "max" if requested > deployment.max_dp_size else "min"
        how += f", clamped to {bound} {target} (limits [{deployment.min_dp_size}, {deployment.max_dp_size}])"
    return SizeDecision(requested=requested, target=target, note=how)


def decide(
    session: Session,
    caller: Caller,
    intent: ScaleIntent,
    *,
    settings: Settings,
    details: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> HookOutcome:
    """Act on one intent: record the desired size, create the job or record why not yet. Never raises
    for a decision."""
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
        earlier = recorded_with(
            session,
            "dedupe_key",
            intent.dedupe_key,
            since=now - timedelta(seconds=settings.hooks_dedupe_window_s),
            source=caller.source,
            deployment_id=deployment.id,
        )
        if earlier is not None and earlier.decision in (HookDecision.accepted, HookDecision.deferred):
            return note(
                HookDecision.ignored,
                "duplicate",
                f"duplicate notification: this alert group and firing episode was already taken "
                f"(request {earlier.id}, {earlier.decision})",
            )
    size = resolve_size(intent, deployment, desired.base_size(session, deployment))
    sized: dict[str, Any] = {"requested": size.requested, "target": size.target}

    def want() -> None:
        desired.set_desired(
            deployment,
            size=size.target,
            source=caller.source.value,
            requester=caller.requester,
            reason=intent.reason,
            now=now,
        )

    want()
    blocked = desired.blocker(session, deployment, now)
    if size.target == deployment.current_dp_size and (blocked is None or blocked.code != "active-job"):
        return note(
            HookDecision.ignored,
            "already-at-size",
            f"already at DP size {size.target} ({size.note})",
            **sized,
        )
    if blocked is not None:
        if blocked.until is not None:
            details = {**details, "next_scale_at": blocked.until.isoformat()}
        return note(
            HookDecision.deferred,
            blocked.code,
            f"desired size {size.target} recorded ({size.note}); {blocked.reason}: the coordinator acts "
            "when that ends, no repeat needed",
            **sized,
        )
    accepted: list[InboundHookRequest] = []

    def record_acceptance(session: Session, job: ReconfigurationJob) -> None:
        # Inside the job's own transaction: the job and the record of its acceptance commit together.
        row = new_row(
            caller,
            HookDecision.accepted,
            "scaling",
            f"scaling {deployment.current_dp_size} -> {size.target}: {size.note} ({intent.reason})",
            deployment=deployment,
            details=details,
            now=now,
            job_id=job.id,
            **sized,
        )
        session.add(row)
        accepted.append(row)

    try:
        desired.start_job(
            session,
            deployment,
            target=size.target,
            source=caller.source.value,
            requester=caller.requester,
            reason=f"{intent.reason} ({size.note})",
            on_created=record_acceptance,
        )
    except DomainError as exc:
        session.rollback()
        want()  # the rollback dropped it; the reconciler tries again later
        return note(HookDecision.deferred, "job-refused", f"job not created yet: {exc.detail}", **sized)
    except IntegrityError:  # our webhook-id was recorded by a concurrent copy: nothing was created
        session.rollback()
        raise replayed_error(session, caller) from None
    return outcome_of(accepted[0])


def handle_alertmanager(
    session: Session, caller: Caller, payload: AlertmanagerPayload, *, settings: Settings
) -> AlertmanagerOutcome:
    """One result per deployment the firing alerts name, plus one per (deployment, reason) skipped:
    resolved alerts are ignored, alerts whose labels cannot be used are rejected (the router answers
    4xx, so Alertmanager logs the mistake)."""
    result = plan(payload)
    context = {"group_key": payload.groupKey, "receiver": payload.receiver, "status": payload.status}
    outcomes = [
        decide(session, caller, intent, settings=settings, details=context) for intent in result.intents
    ]
    grouped: dict[tuple[str | None, str, bool], list[str]] = {}
    for skipped in result.skipped:
        key = (skipped.deployment, skipped.reason, skipped.resolved)
        grouped.setdefault(key, []).extend(skipped.fingerprints)
    for (deployment_name, reason, resolved), alerts in grouped.items():
        outcomes.append(
            record(
                session,
                caller,
                HookDecision.ignored if resolved else HookDecision.rejected,
                "alert-skipped" if resolved else "unusable-labels",
                reason,
                deployment_name=deployment_name,
                details={**context, "alerts": alerts},
            )
        )
    return AlertmanagerOutcome(results=outcomes)
