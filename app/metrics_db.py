"""What `/metrics` reads from the database at scrape time: jobs in progress, each deployment's sizes,
status and engines, and the webhook backlog. Read fresh on every scrape, so the figures are right after
a restart and the same whichever coordinator Prometheus asks."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from fastapi import Request
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app import metrics
from app.core.clock import utc_now
from app.deployments.engines.models import Engine as EngineRow
from app.deployments.engines.models import EngineState
from app.deployments.models import Deployment, DeploymentStatus
from app.deployments.spares import spare_ids
from app.jobs.models import ReconfigurationJob
from app.jobs.states import ACTIVE_STATES
from app.scale.desired import desired_public
from app.webhooks.models import DeliveryState, WebhookDelivery, WebhookSubscription

COUNTED_ENGINE_STATES = sorted(state.value for state in EngineState if state is not EngineState.left)


def refresh(request: Request) -> None:
    """Set every gauge of state from the app's database (`app.state.db_engine`)."""
    engine = getattr(request.app.state, "db_engine", None)
    if engine is not None:
        refresh_from(engine)


def refresh_from(engine: Engine) -> None:
    with Session(engine) as session:
        _jobs_in_progress(session)
        _deployments(session)
        _webhook_backlog(session)


def _jobs_in_progress(session: Session) -> None:
    active = sorted(state.value for state in ACTIVE_STATES)
    state_column = col(ReconfigurationJob.state)
    names = {dep: name for dep, name in session.execute(sa.select(col(Deployment.id), col(Deployment.name)))}
    rows = session.execute(
        sa.select(col(ReconfigurationJob.deployment_id), state_column, sa.func.count())
        .where(state_column.in_(active))
        .group_by(col(ReconfigurationJob.deployment_id), state_column)
    ).all()
    counts = {(names[dep], str(state)): int(n) for dep, state, n in rows if dep in names}
    metrics.set_jobs_in_progress(counts, sorted(names.values()), active)


def _deployments(session: Session) -> None:
    deployments = session.exec(select(Deployment).order_by(col(Deployment.name))).all()
    rows = []
    for deployment in deployments:
        wanted = desired_public(session, deployment)
        size = wanted.dp_size if wanted.dp_size is not None else deployment.current_dp_size
        rows.append((deployment.name, deployment.current_dp_size, size, wanted.pending, deployment.status))
    names = {d.id: d.name for d in deployments}
    counts = session.execute(
        sa.select(col(EngineRow.deployment_id), col(EngineRow.state), sa.func.count())
        .where(col(EngineRow.state) != EngineState.left.value)
        .group_by(col(EngineRow.deployment_id), col(EngineRow.state))
    ).all()
    engines = {(names[dep], str(state)): int(n) for dep, state, n in counts if dep in names}
    metrics.set_deployment_gauges(
        rows, engines, [status.value for status in DeploymentStatus], COUNTED_ENGINE_STATES
    )
    held = spare_ids(session, deployments)
    metrics.set_spare_gauges({d.name: (len(held.get(d.id, [])), d.spares) for d in deployments})


def _webhook_backlog(session: Session) -> None:
    pending = col(WebhookDelivery.state) == DeliveryState.pending.value
    joined = sa.join(
        WebhookDelivery.__table__,  # type: ignore[attr-defined]
        WebhookSubscription.__table__,  # type: ignore[attr-defined]
        col(WebhookDelivery.subscription_id) == col(WebhookSubscription.id),
    )
    rows = session.execute(
        sa.select(col(WebhookSubscription.id), col(WebhookSubscription.active), sa.func.count())
        .select_from(joined)
        .where(pending)
        .group_by(col(WebhookSubscription.id), col(WebhookSubscription.active))
    ).all()
    oldest = session.execute(
        sa.select(col(WebhookSubscription.id), sa.func.min(col(WebhookDelivery.created_at)))
        .select_from(joined)
        .where(pending, col(WebhookSubscription.active).is_(True))
        .group_by(col(WebhookSubscription.id))
    ).all()
    now = utc_now()
    ages = {
        str(sid): 0.0
        for sid in session.execute(
            sa.select(col(WebhookSubscription.id)).where(col(WebhookSubscription.active).is_(True))
        ).scalars()
    }
    ages.update({str(sid): (now - _aware(at)).total_seconds() for sid, at in oldest if at is not None})
    metrics.set_webhook_backlog({(str(sid), bool(active)): int(n) for sid, active, n in rows}, ages)


def _aware(value: object) -> datetime:
    """`min()` over a column comes back without the column's type: naive on SQLite."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
