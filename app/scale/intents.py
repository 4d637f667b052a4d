"""Scale intents: what an autoscaler (or a deferred `/scale` write) asked of a deployment, one row per
distinct ask, with its life. HTTP-free; this module is the one writer of `scale_intents`.

An intent *stands* from when it is asked until it ends:
- `pending`: not yet acted on; the rule (`app.scale.stabilize`) decides when it moves the deployment;
- `acted`: a job moved the deployment for it (`job_id`), or it found the deployment at its size; it
  never moves the deployment again, but while it stands it still counts as an ask (it holds
  scale-downs below its size);
- ended before it was acted on: `withdrawn` (its alert resolved, or left the group; its sender
  withdrew it; it expired) or `superseded` (an operator's job, a `/scale` write, or its stream's newer
  intent replaced it);
- `ended` once acted on, for the same reasons (`end_code` says which).

A *stream* is where intents replace each other: an Alertmanager group (per deployment), a generic
hook's `group` (by default its sender), or the `/scale` subresource. A stream has at most one standing
intent per deployment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from datetime import datetime
from enum import StrEnum

import sqlalchemy as sa
from sqlmodel import Field, Session, SQLModel, col, select

from app.core.clock import utc_now
from app.core.db import UTCDateTime
from app.core.ids import new_id
from app.deployments.autoscaling import IntentSummary

INTENT_ID_PREFIX = "int"
SPEC_SOURCE = "scale-subresource"  # a deferred /scale write: acted on first, never stabilized or paused


class IntentState(StrEnum):
    pending = "pending"
    acted = "acted"
    withdrawn = "withdrawn"
    superseded = "superseded"
    ended = "ended"


STANDING = (IntentState.pending.value, IntentState.acted.value)


class EndCode(StrEnum):
    resolved = "resolved"  # its alert resolved (or its sender sent `status: resolved`)
    left_group = "left-group"  # its group's notification no longer names the deployment
    replaced = "replaced"  # its stream asked again, differently
    operator_job = "operator-job"  # an operator's job started after it
    scale_write = "scale-subresource"  # a `/scale` write after it
    expired = "expired"  # no repeat for EPCTL_HOOKS_INTENT_TTL_S


class ScaleIntentRow(SQLModel, table=True):
    __tablename__ = "scale_intents"
    __table_args__ = (
        sa.Index("ix_scale_intents_deployment_ended", "deployment_id", "ended_at"),
        sa.Index("ix_scale_intents_stream", "stream", "state"),
    )

    id: str = Field(primary_key=True, max_length=40)
    deployment_id: str = Field(max_length=40, description="no foreign key: an audit record")
    source: str = Field(sa_type=sa.String(32))
    stream: str = Field(max_length=64, description="sha256 of the stream's key")
    state: str = Field(sa_type=sa.String(16))
    target_dp_size: int = Field(description="after min/max clamping")
    requested_dp_size: int
    step: int | None = None
    anchor_dp_size: int | None = Field(default=None, description="what a step counted from")
    requester: str | None = Field(default=None, max_length=128)
    reason: str | None = Field(default=None, max_length=1000)
    request_id: str | None = Field(default=None, max_length=40, description="the hook record that asked")
    job_id: str | None = Field(
        default=None, max_length=40, description="the job that acted on it last (a step, while pending)"
    )
    attempts: int = Field(
        default=0,
        sa_column_kwargs={"server_default": "0"},
        description="its moves that failed or rolled back",
    )
    retry_at: datetime | None = Field(
        default=None, sa_type=UTCDateTime, description="its next move, not before"
    )
    end_code: str | None = Field(default=None, sa_type=sa.String(32))
    ended_by: str | None = Field(default=None, max_length=40, description="a hook record or job id")
    created_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    last_seen_at: datetime = Field(default_factory=utc_now, sa_type=UTCDateTime)
    acted_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    ended_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


def stream_key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def new_intent(
    *,
    deployment_id: str,
    source: str,
    stream: str,
    target: int,
    requested: int,
    step: int | None,
    anchor: int | None,
    requester: str | None,
    reason: str | None,
    now: datetime,
) -> ScaleIntentRow:
    return ScaleIntentRow(
        id=new_id(INTENT_ID_PREFIX),
        deployment_id=deployment_id,
        source=source[:32],
        stream=stream,
        state=IntentState.pending.value,
        target_dp_size=target,
        requested_dp_size=requested,
        step=step,
        anchor_dp_size=anchor,
        requester=requester[:128] if requester else None,
        reason=reason[:1000] if reason else None,
        created_at=now,
        last_seen_at=now,
    )


def standing_in_stream(session: Session, deployment_id: str, stream: str) -> ScaleIntentRow | None:
    return session.exec(
        select(ScaleIntentRow)
        .where(
            col(ScaleIntentRow.deployment_id) == deployment_id,
            col(ScaleIntentRow.stream) == stream,
            col(ScaleIntentRow.state).in_(STANDING),
        )
        .order_by(col(ScaleIntentRow.created_at).desc())
        .limit(1)
    ).first()


def standing_streams(session: Session, stream: str) -> list[ScaleIntentRow]:
    """Every deployment's standing intent of one stream key (an Alertmanager group names several)."""
    return list(
        session.exec(
            select(ScaleIntentRow).where(
                col(ScaleIntentRow.stream) == stream, col(ScaleIntentRow.state).in_(STANDING)
            )
        ).all()
    )


def recent(session: Session, deployment_id: str, since: datetime) -> list[ScaleIntentRow]:
    """The deployment's intents that stand, or ended after `since` (what a window looks back on)."""
    return list(
        session.exec(
            select(ScaleIntentRow)
            .where(
                col(ScaleIntentRow.deployment_id) == deployment_id,
                sa.or_(col(ScaleIntentRow.ended_at).is_(None), col(ScaleIntentRow.ended_at) > since),
            )
            .order_by(col(ScaleIntentRow.created_at), col(ScaleIntentRow.id))
        ).all()
    )


def with_recent(session: Session, deployment_ids: Collection[str], since: datetime) -> set[str]:
    """Which of these deployments have an intent `recent` would list (one query for any number)."""
    if not deployment_ids:
        return set()
    rows = session.exec(
        select(ScaleIntentRow.deployment_id)
        .where(
            col(ScaleIntentRow.deployment_id).in_(list(deployment_ids)),
            sa.or_(col(ScaleIntentRow.ended_at).is_(None), col(ScaleIntentRow.ended_at) > since),
        )
        .distinct()
    ).all()
    return set(rows)


def end(intent: ScaleIntentRow, code: EndCode, *, by: str | None, now: datetime) -> bool:
    """End a standing intent: withdrawn/superseded if it was pending, `ended` if acted on. False if it
    had already ended."""
    if intent.state not in STANDING:
        return False
    if intent.state == IntentState.acted.value:
        intent.state = IntentState.ended.value
    elif code in (EndCode.replaced, EndCode.operator_job, EndCode.scale_write):
        intent.state = IntentState.superseded.value
    else:
        intent.state = IntentState.withdrawn.value
    intent.end_code = code.value
    intent.ended_by = by
    intent.ended_at = now
    return True


def mark_acted(intent: ScaleIntentRow, *, job_id: str | None, now: datetime) -> None:
    intent.state = IntentState.acted.value
    intent.job_id = job_id
    intent.acted_at = now
    intent.retry_at = None


def mark_stepped(intent: ScaleIntentRow, *, job_id: str) -> None:
    """A step toward its size (a rate policy's): it stays pending, for the next period's step."""
    intent.job_id = job_id
    intent.retry_at = None


def mark_failed(intent: ScaleIntentRow, *, retry_at: datetime) -> None:
    """Its move failed or rolled back: pending again, tried again from `retry_at`."""
    intent.state = IntentState.pending.value
    intent.acted_at = None
    intent.attempts += 1
    intent.retry_at = retry_at


def supersede_older(
    session: Session, deployment_id: str, *, code: EndCode, by: str, before: datetime
) -> list[ScaleIntentRow]:
    """End every intent of the deployment that stands and is older than `before` (an operator's job, a
    `/scale` write); the pending ones among those it ended are returned (they lost their ask)."""
    rows = session.exec(
        select(ScaleIntentRow).where(
            col(ScaleIntentRow.deployment_id) == deployment_id,
            col(ScaleIntentRow.state).in_(STANDING),
            col(ScaleIntentRow.created_at) <= before,
        )
    ).all()
    lost = []
    for row in rows:
        was_pending = row.state == IntentState.pending.value
        if end(row, code, by=by, now=before):
            session.add(row)
            if was_pending:
                lost.append(row)
    return lost


def expire_unrepeated(
    session: Session, deployment_id: str, *, older_than: datetime, now: datetime
) -> list[ScaleIntentRow]:
    """End standing autoscaler intents nobody repeated since `older_than` (an Alertmanager that stopped
    sending without a resolved notification); returns them."""
    rows = session.exec(
        select(ScaleIntentRow).where(
            col(ScaleIntentRow.deployment_id) == deployment_id,
            col(ScaleIntentRow.state).in_(STANDING),
            col(ScaleIntentRow.last_seen_at) < older_than,
        )
    ).all()
    for row in rows:
        end(row, EndCode.expired, by=None, now=now)
        session.add(row)
    return list(rows)


def summaries(rows: Sequence[ScaleIntentRow], limit: int = 20) -> list[IntentSummary]:
    standing = [r for r in rows if r.state in STANDING]
    standing.sort(key=lambda r: (r.created_at, r.id), reverse=True)
    return [
        IntentSummary(
            id=r.id,
            source=r.source,
            state=r.state,
            target_dp_size=r.target_dp_size,
            requester=r.requester,
            reason=r.reason,
            since=r.created_at,
            job_id=r.job_id,
            request_id=r.request_id,
            attempts=r.attempts,
            retry_at=r.retry_at,
        )
        for r in standing[:limit]
    ]


def prune_ended(session: Session, *, older_than: datetime) -> int:
    """Delete intents that ended before `older_than` (retention); returns how many."""
    result = session.execute(
        sa.delete(ScaleIntentRow).where(
            col(ScaleIntentRow.ended_at).is_not(None), col(ScaleIntentRow.ended_at) < older_than
        )
    )
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
