"""An Alertmanager notification -> one decision per deployment it names (`app.scale.hooks.decide`), plus
the records of what it cannot act on, written in one transaction, and the withdrawal of its group's
intents for deployments it no longer names. Bounded: a notification decides for at most
`MAX_DEPLOYMENTS_PER_NOTIFICATION` deployments and lists unusable alerts in at most
`MAX_SKIP_RECORDS` records; the rest is recorded as counts. HTTP-free."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.deployments.models import Deployment
from app.scale import intents
from app.scale.hooks.alertmanager import MAX_SKIP_RECORDS, AlertmanagerPayload, ScaleAsk, plan
from app.scale.hooks.decide import decide, withdraw
from app.scale.hooks.models import AlertmanagerOutcome, HookDecision, HookOutcome, InboundHookRequest
from app.scale.hooks.service import Caller, new_row, outcome_of
from app.scale.intents import EndCode


def handle_alertmanager(
    session: Session, caller: Caller, payload: AlertmanagerPayload
) -> AlertmanagerOutcome:
    """One result per deployment the notification names (up to a cap), plus one per (deployment, reason)
    skipped: alerts whose labels cannot be used are rejected (the router answers 4xx, so Alertmanager
    logs the mistake). A deployment whose standing intent of this group is no longer named has it
    withdrawn. Records of refusals are written in one transaction."""
    result = plan(payload)
    context: dict[str, Any] = {
        "group_key": payload.groupKey,
        "receiver": payload.receiver,
        "status": payload.status,
    }
    if payload.truncatedAlerts:
        context["truncated_alerts"] = payload.truncatedAlerts  # alerts Alertmanager left out (max_alerts)
    names = result.named | set(result.beyond_cap)
    known = (
        {d.name: d for d in session.exec(select(Deployment).where(col(Deployment.name).in_(names))).all()}
        if names
        else {}
    )
    outcomes: list[HookOutcome] = []
    refused: list[InboundHookRequest] = []
    for ask in result.asks:
        deployment = known.get(ask.deployment)
        details = {**context, "alerts": list(ask.fingerprints)}
        if deployment is None:
            refused.append(
                new_row(
                    caller,
                    HookDecision.rejected,
                    "unknown-deployment",
                    f"no deployment named {ask.deployment!r}",
                    deployment_name=ask.deployment,
                    details=details,
                )
            )
            continue
        outcomes.append(decide(session, caller, ask, details=details, deployment=deployment))
    grouped: dict[tuple[str | None, str, bool], list[str]] = {}
    for skipped in result.skipped:
        grouped.setdefault((skipped.deployment, skipped.reason, skipped.resolved), []).extend(
            skipped.fingerprints
        )
    for index, ((name, reason, resolved), alerts) in enumerate(grouped.items()):
        if index == MAX_SKIP_RECORDS:
            rest = sum(len(a) for a in list(grouped.values())[index:])
            refused.append(
                new_row(
                    caller,
                    HookDecision.rejected,
                    "unusable-labels",
                    f"{len(grouped) - index} more groups of unusable alerts ({rest} alerts), not listed "
                    "one by one",
                    details={**context, "alerts_not_listed": rest},
                )
            )
            break
        refused.append(
            new_row(
                caller,
                HookDecision.ignored if resolved else HookDecision.rejected,
                "alert-skipped" if resolved else "unusable-labels",
                reason,
                deployment_name=name,
                details={**context, "alerts": alerts[:20], "alert_count": len(alerts)},
            )
        )
    if result.beyond_cap:
        count = sum(result.beyond_cap.values())
        refused.append(
            new_row(
                caller,
                HookDecision.rejected,
                "too-many-deployments",
                f"{count} alerts naming {len(result.beyond_cap)} more deployments were not decided: one "
                f"notification decides for at most {len(result.named)} (group_by deployment)",
                details={
                    **context,
                    "alerts_beyond_cap": count,
                    "deployments_beyond_cap": len(result.beyond_cap),
                },
            )
        )
    outcomes.extend(_left_group(session, caller, result.stream, {d.id for d in known.values()}, context))
    if refused:
        session.add_all(refused)
        session.commit()
        outcomes.extend(outcome_of(row) for row in refused)
    return AlertmanagerOutcome(results=outcomes)


def _left_group(
    session: Session, caller: Caller, stream: str, named_ids: set[str], context: dict[str, Any]
) -> list[HookOutcome]:
    """Standing intents of this group for deployments it no longer names: withdrawn (or ended)."""
    outcomes = []
    for standing in intents.standing_streams(session, stream):
        if standing.deployment_id in named_ids or standing.source != caller.source.value:
            continue
        deployment = session.get(Deployment, standing.deployment_id)
        if deployment is None:
            continue
        ask = ScaleAsk(
            deployment=deployment.name,
            target_dp_size=None,
            step=None,
            reason="alertmanager: the group no longer names this deployment",
            stream=stream,
            resolved=True,
        )
        outcomes.append(
            withdraw(session, caller, deployment, ask, dict(context), utc_now(), EndCode.left_group)
        )
    return outcomes
