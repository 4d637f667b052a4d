"""Fenced generations: a generation number is granted once, by the coordinator, in the database.

A job's new generation is one above every generation the deployment ever had: its recorded one, every
number granted to its earlier jobs (whether they succeeded, failed or rolled back: an abandoned number
is never handed out again) and every generation an engine reports (an agent that completed a switch the
record does not know of, after a freeze). It is written on the job (`to_generation`) before any agent
hears of it, so a coordinator that restarts reconciles the job against the number the agents got. So two
groups can never carry the same generation, and an agent's generation alone tells whose it is.

The agents fence their side (`engine_agent/reconfig/window.py`): a switch that comes after the pause
lease ran out is refused, and the coordinator abandons a commit only after its switch deadline, which
is longer than the pause lease, so no agent can complete a switch the coordinator gave up on.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlmodel import Session

from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationJob

_JOBS = ReconfigurationJob.__table__  # type: ignore[attr-defined]


def grant_generation(session: Session, *, job_id: str, deployment_id: str, reported: Iterable[int]) -> int:
    """The new generation of `job_id` (see the module doc), recorded on the job and committed."""
    deployment = session.get(Deployment, deployment_id)
    assert deployment is not None
    granted_before = session.execute(
        sa.select(sa.func.max(_JOBS.c.to_generation)).where(
            _JOBS.c.deployment_id == deployment_id, _JOBS.c.id != job_id
        )
    ).scalar()
    generation = 1 + max(deployment.generation, int(granted_before or 0), *reported, 0)
    session.execute(sa.update(_JOBS).where(_JOBS.c.id == job_id).values(to_generation=generation))
    session.commit()
    return generation
