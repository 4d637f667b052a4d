"""A member's first report that its group broke, in the heartbeat's own transaction (issue 34): the
deployment's status is judged (`judge.judge_reported_break`, pure) and written (`act.write_reported_break`,
through the one status writer with its event and incident) before the heartbeat commits, so no reader
sees the member out of its group while the deployment reads `ready`. The pass the report wakes judges
the rest (who stalled, what was lost, the heal) as before.

The deployment's row is locked first (`FOR UPDATE`; SQLite's one writer serializes anyway): a job's switch
or another member's report in between cannot leave a status judged on what was no longer the record.
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from app.backends.reference.liveness import observe
from app.backends.reference.liveness.act import write_reported_break
from app.backends.reference.liveness.judge import judge_reported_break
from app.backends.reference.liveness.view import Hearing, Rules
from app.core.clock import utc_now
from app.deployments.models import Deployment, DeploymentStatus


def group_broke(session: Session, deployment_id: str, rules: Rules) -> None:
    """Judge and write the status, in the caller's transaction (it commits)."""
    session.flush()  # the reporting engine's row, as the view reads it
    locked = session.exec(
        select(Deployment)
        .where(col(Deployment.id) == deployment_id)
        .with_for_update()
        .execution_options(populate_existing=True)  # as locked, not as read earlier in the transaction
    ).one_or_none()
    if locked is None or locked.status != DeploymentStatus.ready.value or locked.current_dp_size == 0:
        return
    now = utc_now()
    # Silence is not judged here: the hearing only fills the view.
    heard = Hearing(newest_heartbeat_at=now, watching_since=now, deaf_at=None)
    for view in observe.views(session, heard, only=deployment_id):
        write_reported_break(session, view, judge_reported_break(view, now, rules), now)
