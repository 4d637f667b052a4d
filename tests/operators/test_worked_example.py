"""The worked example of docs/operations/webhooks-and-autoscalers.md ("The rule for competing intents"),
played minute by minute through the real intake, reconciler and job service: if the docs' table and the
coordinator ever disagree, this fails."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import Session, col, select

from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import create_reconfiguration
from app.jobs.states import JobState
from app.scale import desired
from app.scale.hooks.alertmanager import AlertmanagerPayload
from app.scale.hooks.models import HookOutcome
from app.scale.hooks.notifications import handle_alertmanager
from tests.operators.intent_world import ALERTMANAGER, Clock, end_active_job, notification, world

QUEUE_LONG = {"target_dp_size": "6"}
IDLE = {"target_dp_size": "3"}


def at(clock: Clock, start: Any, minutes: int, seconds: int = 0) -> None:
    clock.now = start + timedelta(minutes=minutes, seconds=seconds)


def alert(
    session: Session, group: str, labels: dict[str, str], *, episode: int = 0, status: str = "firing"
) -> HookOutcome:
    body = notification(group, episode, ("a",), labels, status)
    [result] = handle_alertmanager(session, ALERTMANAGER, AlertmanagerPayload.model_validate(body)).results
    return result


def reconcile(session: Session, clock: Clock) -> list[tuple[int, int]]:
    return [(job.from_dp_size, job.to_dp_size) for job in desired.reconcile(session, now=clock.now)]


def sizes_of_jobs(session: Session) -> list[tuple[int, int]]:
    jobs = session.exec(select(ReconfigurationJob).order_by(col(ReconfigurationJob.created_at))).all()
    return [(job.from_dp_size, job.to_dp_size) for job in jobs]


def test_the_worked_example_of_the_docs(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults: dict[str, Any] = {}  # scale-down window 300 s, scale-up 0 s, no max step
    with world(monkeypatch, defaults, 60.0, max_dp_size=8, current=4) as (session, clock):
        start = clock.now
        idle = alert(session, "Idle", IDLE)
        assert (idle.decision, idle.code) == ("held", "stabilization-window")
        assert idle.next_scale_at == start + timedelta(minutes=5)

        at(clock, start, 1)
        queue = alert(session, "QueueLong", QUEUE_LONG)
        assert (queue.decision, sizes_of_jobs(session)) == ("accepted", [(4, 6)])
        at(clock, start, 2)
        end_active_job(session, JobState.succeeded)  # each job takes a minute

        for minute in range(3, 10):
            at(clock, start, minute)
            assert alert(session, "QueueLong", QUEUE_LONG).code == "duplicate"
            assert alert(session, "Idle", IDLE).code == "duplicate"
            assert reconcile(session, clock) == []
        waiting = desired.desired_public(session, session.exec(select(Deployment)).one(), clock.now)
        assert (waiting.intent_id, waiting.blocked_by) == (idle.intent_id, "higher-intent")

        at(clock, start, 9, 30)
        resolved = alert(session, "QueueLong", QUEUE_LONG, status="resolved")
        assert (resolved.decision, resolved.code) == ("ignored", "resolved")

        at(clock, start, 14, 29)
        assert reconcile(session, clock) == []
        at(clock, start, 14, 30)
        assert reconcile(session, clock) == [(6, 3)]
        at(clock, start, 15)
        assert alert(session, "Idle", IDLE).code == "duplicate"
        at(clock, start, 15, 30)
        end_active_job(session, JobState.succeeded)

        at(clock, start, 15, 50)
        again = alert(session, "QueueLong", QUEUE_LONG, episode=1)
        assert (again.decision, again.code) == ("deferred", "cooldown")
        assert again.next_scale_at == start + timedelta(minutes=16, seconds=30)
        at(clock, start, 16, 30)
        assert reconcile(session, clock) == [(3, 6)]
        at(clock, start, 17, 30)
        end_active_job(session, JobState.succeeded)

        at(clock, start, 18)
        create_reconfiguration(
            session,
            request=ReconfigurationCreate(deployment="d1", target_dp_size=4),
            requested_by=RequestSource.cli,
            on_created=desired.supersede_for_job,
        )
        at(clock, start, 18, 10)
        assert alert(session, "QueueLong", QUEUE_LONG, episode=1).code == "duplicate"
        at(clock, start, 19)
        end_active_job(session, JobState.succeeded)
        assert reconcile(session, clock) == []
        assert sizes_of_jobs(session) == [(4, 6), (6, 3), (3, 6), (6, 4)]


def test_had_idle_resolved_before_it_was_acted_on_it_would_have_been_withdrawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with world(monkeypatch, {}, 60.0, max_dp_size=8, current=4) as (session, clock):
        start = clock.now
        alert(session, "Idle", IDLE)
        at(clock, start, 3)
        withdrawn = alert(session, "Idle", IDLE, status="resolved")
        assert (withdrawn.decision, withdrawn.code) == ("withdrawn", "resolved")
        at(clock, start, 60)
        assert reconcile(session, clock) == [] and sizes_of_jobs(session) == []
