"""Every decision about an intent is a record (issue 36): an intent deferred for an active job that,
once the job has ended, is held by the rule gets a record of the hold; a pass that changes nothing
writes nothing."""

from __future__ import annotations

import pytest
from sqlmodel import col, select

from app.jobs.models import ReconfigurationCreate, RequestSource
from app.jobs.service import create_reconfiguration
from app.jobs.states import JobState
from app.scale import desired
from app.scale.hooks.alertmanager import AlertmanagerPayload
from app.scale.hooks.models import InboundHookRequest
from app.scale.hooks.notifications import handle_alertmanager
from tests.operators.intent_world import ALERTMANAGER, end_active_job, notification, world


def test_deferred_then_held_is_two_records(monkeypatch: pytest.MonkeyPatch) -> None:
    with world(monkeypatch, {}, 0.0, current=2) as (session, clock):
        create_reconfiguration(
            session,
            request=ReconfigurationCreate(deployment="d1", target_dp_size=3),
            requested_by=RequestSource.api,
        )
        body = notification("Idle", 0, ("a",), {"target_dp_size": "1"}, "firing")
        [asked] = handle_alertmanager(session, ALERTMANAGER, AlertmanagerPayload.model_validate(body)).results
        assert (asked.decision, asked.code) == ("deferred", "active-job")
        end_active_job(session, JobState.succeeded)
        desired.reconcile(session, now=clock.now)
        desired.reconcile(session, now=clock.now)  # nothing changed: no second record

        rows = session.exec(
            select(InboundHookRequest)
            .where(col(InboundHookRequest.intent_id) == asked.intent_id)
            .order_by(col(InboundHookRequest.created_at), col(InboundHookRequest.id))
        ).all()
        decisions = [(r.decision, (r.payload or {}).get("code")) for r in rows]
        assert decisions == [("deferred", "active-job"), ("held", "stabilization-window")]
