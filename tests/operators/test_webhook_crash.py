"""A coordinator killed (SIGKILL) between a transition and its webhook delivery still delivers it after a
restart, under the same webhook-id, so a receiver that dedupes by id processes every event once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.jobs.states import JobState
from app.jobs.transitions import transition
from app.webhooks import service
from app.webhooks.delivery import ATTEMPT_ABANDONED
from app.webhooks.models import OutboxEvent
from app.webhooks.service import DeliveryList
from tests.operators.receiver import ALLOW_LOOPBACK_ENV, ScriptedResponse, WebhookReceiver
from tests.support.factories import make_job, static_deployment
from tests.support.processes import Coordinator
from tests.support.waiting import wait_until

FAST_WORKER = {
    "EPCTL_WEBHOOK_POLL_S": "0.05",
    "EPCTL_WEBHOOK_TIMEOUT_S": "1",
    "EPCTL_WEBHOOK_CLAIM_LEASE_S": "1",  # effective lease: timeout + 1 s
    "EPCTL_WEBHOOK_RETRY_BASE_S": "0.05",
    "EPCTL_AUTO_MIGRATE": "false",  # the test's database is migrated already
    **ALLOW_LOOPBACK_ENV,  # the receiver listens on loopback
}


def wait_until_settled(session: Session, subscription_id: str) -> DeliveryList:
    """The delivery log once no delivery is pending (the coordinator records a result after the answer)."""

    def settled() -> DeliveryList | None:
        session.rollback()  # a fresh snapshot each time
        log = service.list_deliveries(session, subscription_id)
        return log if all(d.state.value != "pending" for d in log.data) else None

    return wait_until(settled, timeout_s=20, what="every delivery to leave `pending`")


def move(db_engine: Engine, job_id: str, before: JobState, after: JobState) -> None:
    with Session(db_engine) as session:
        transition(session, job_id=job_id, from_state=before, to_state=after)


@pytest.mark.processes
def test_coordinator_killed_mid_delivery_delivers_every_event_after_restart(
    database_url: str, tmp_path: Path, session: Session, db_engine: Engine
) -> None:
    job_id = make_job(session, static_deployment(session, "d1", engines=3), 3).id
    release = threading.Event()
    with WebhookReceiver().running() as receiver:
        subscription = service.create_subscription(session, service.WebhookCreate(url=receiver.url))
        receiver.secret = subscription.secret
        receiver.respond(ScriptedResponse(200, hold=release))  # the first delivery hangs in the receiver
        try:
            with Coordinator(database_url, tmp_path / "data", env=FAST_WORKER) as first:
                move(db_engine, job_id, JobState.pending, JobState.preparing)  # event A
                assert receiver.wait_for(lambda r: len(r.arrivals) == 1), first.log_tail()
                first.kill()  # A is in flight: claimed, sent, never acknowledged
            move(
                db_engine, job_id, JobState.preparing, JobState.rolled_back
            )  # event B, while no coordinator runs
        finally:
            release.set()  # the receiver acts on A, but its answer reaches no one
        with session.begin():
            event_ids = set(session.exec(select(OutboxEvent.id)).all())
        assert len(event_ids) == 2
        with Coordinator(database_url, tmp_path / "data", env=FAST_WORKER) as second:
            delivered = receiver.wait_for(
                lambda r: set(r.processed) == event_ids and len(r.requests) >= 3, timeout=20
            )
            assert delivered, second.log_tail()
            log = wait_until_settled(session, subscription.id)
        assert all(r.signature_valid for r in receiver.requests)
    first_event = receiver.arrivals[0]
    assert receiver.arrivals.count(first_event) == 2, "A was sent again, with the same webhook-id"
    assert sorted(receiver.processed) == sorted(event_ids), "each event processed once"
    assert {d.state.value for d in log.data} == {"succeeded"}
    [retried] = [d for d in log.data if d.event_id == first_event]
    assert [(a.attempt, a.status_code) for a in retried.attempts] == [(1, None), (2, 200)]
    assert retried.attempts[0].error == ATTEMPT_ABANDONED
