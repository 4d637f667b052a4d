"""A deployment on a database of its own (SQLite in memory) with a clock the test moves: what the
intent tests that play sequences of notifications through the real intake, reconciler and job
service share (`test_intent_properties.py`, `test_worked_example.py`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, SQLModel, create_engine, select

import app.jobs.service
import app.jobs.transitions
import app.scale.desired
import app.scale.hooks.decide
import app.scale.hooks.notifications
import app.scale.hooks.service
from app.deployments.models import Deployment
from app.jobs.service import active_job
from app.jobs.states import JobState
from app.jobs.transitions import transition
from app.scale.hooks.models import HookSource
from app.scale.hooks.service import Caller
from app.tables import metadata
from tests.operators.alertmanager_payloads import alert, payload
from tests.support.factories import make_deployment, register_engines

CLOCKED = (
    app.scale.hooks.decide,
    app.scale.hooks.notifications,
    app.scale.hooks.service,
    app.jobs.service,
    app.jobs.transitions,
    app.scale.desired,
)
ALERTMANAGER = Caller(HookSource.alertmanager, requester="alertmanager")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@contextmanager
def world(
    monkeypatch: pytest.MonkeyPatch,
    behavior: dict[str, Any],
    cooldown_s: float,
    *,
    max_dp_size: int = 4,
    current: int = 2,
) -> Iterator[tuple[Session, Clock]]:
    """Deployment d1 (static, `max_dp_size` engines known, at DP size `current`) and the clock."""
    clock = Clock()
    with monkeypatch.context() as patch:
        for module in CLOCKED:
            patch.setattr(module, "utc_now", clock)
        engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
        SQLModel.metadata.create_all(engine, tables=list(metadata().tables.values()))
        with Session(engine) as session:
            deployment = make_deployment(
                session,
                "d1",
                max_dp_size=max_dp_size,
                launcher="static",
                autoscale_cooldown_s=cooldown_s,
                autoscale_behavior=behavior,
            )
            register_engines(session, deployment, max_dp_size)
            deployment.current_dp_size = current
            session.add(deployment)
            session.commit()
            yield session, clock
        engine.dispose()


def notification(
    group: str, episode: int, members: tuple[str, ...], labels: dict[str, str], status: str
) -> dict[str, Any]:
    starts = f"2026-12-02T1{episode}:00:00.000Z"
    alerts = []
    for member in members:
        body = alert(
            deployment="d1",
            alertname=group,
            status=status,
            starts_at=starts,
            labels={**labels, "instance": member},
        )
        # As Alertmanager's: a hash of the alert's labels.
        body["fingerprint"] = hashlib.sha256(repr(sorted(body["labels"].items())).encode()).hexdigest()[:16]
        alerts.append(body)
    return payload(alerts, group_key=f"{{}}:{{alertname={group!r}}}")


def end_active_job(session: Session, outcome: JobState) -> None:
    deployment = session.exec(select(Deployment)).one()
    job = active_job(session, deployment_id=deployment.id)
    if job is None:
        return
    path = [JobState.preparing, JobState.syncing, JobState.committing]
    path += (
        [JobState.cleaning_up, JobState.succeeded]
        if outcome is JobState.succeeded
        else [JobState.rolled_back]
    )
    for state in path:
        transition(session, job_id=job.id, from_state=JobState(job.state), to_state=state)
        session.refresh(job)
    if outcome is JobState.succeeded:
        session.refresh(deployment)
        deployment.current_dp_size, deployment.generation = job.to_dp_size, job.to_generation
        session.add(deployment)
        session.commit()
