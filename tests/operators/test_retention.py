"""Issue 17, finding 5: the outbox, webhook deliveries, Idempotency-Key records, hook records and
engines that left are pruned once older than their retention; what is still owed (pending deliveries,
undispatched events) and everything recent stays."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from app.core.clock import utc_now
from app.core.config import Settings
from app.deployments.engines.models import Engine as EngineRow
from app.jobs.models import IdempotencyRecord, JobEvent, ReconfigurationJob
from app.retention import prune_all
from app.scale.hooks.models import InboundHookRequest
from app.scale.intents import ScaleIntentRow
from app.webhooks.models import OutboxEvent, WebhookDelivery, WebhookDeliveryAttempt, WebhookSubscription

# The database's own behaviour is part of what these check (tests/support/databases.py).
pytestmark = pytest.mark.databases("sqlite", "postgres")

OLD = utc_now() - timedelta(days=60)
NEW = utc_now() - timedelta(minutes=5)


def _prune(db_engine: Engine, settings: Settings) -> dict[str, int]:
    with Session(db_engine) as session:
        return prune_all(session, settings)


def count(session: Session, table: type) -> int:
    return int(session.exec(select(func.count()).select_from(table)).one())


def test_old_records_are_pruned_and_owed_or_recent_ones_kept(
    db_engine: Engine, tmp_path: Path, deployment_id: str
) -> None:
    with Session(db_engine) as session:
        session.add(WebhookSubscription(id="whk_1", url="http://127.0.0.1:9/", secret="whsec_x"))
        for engine_id, state, updated in (
            ("left_old", "left", OLD),
            ("left_new", "left", NEW),
            ("serving_old", "serving", OLD),  # silent for long, but only the heartbeat expiry judges it
        ):
            session.add(
                EngineRow(
                    id=engine_id,
                    deployment_id=deployment_id,
                    url="http://127.0.0.1:9",
                    platform="cpu",
                    device="cpu",
                    state=state,
                    launched_by="static",
                    updated_at=updated,
                )
            )
        for name, created, dispatched in (
            ("msg_old_done", OLD, OLD),
            ("msg_old_pending", OLD, OLD),
            ("msg_old_undispatched", OLD, None),
            ("msg_new_done", NEW, NEW),
        ):
            session.add(
                OutboxEvent(
                    id=name,
                    type="reconfiguration.succeeded",
                    payload={},
                    created_at=created,
                    dispatched_at=dispatched,
                )
            )
        session.flush()
        for delivery_id, event_id, state, updated in (
            ("dlv_old_done", "msg_old_done", "succeeded", OLD),
            ("dlv_old_pending", "msg_old_pending", "pending", OLD),
            ("dlv_new_done", "msg_new_done", "failed", NEW),
        ):
            session.add(
                WebhookDelivery(
                    id=delivery_id,
                    event_id=event_id,
                    subscription_id="whk_1",
                    state=state,
                    created_at=updated,
                    updated_at=updated,
                )
            )
        session.flush()
        for delivery_id in ("dlv_old_done", "dlv_old_pending", "dlv_new_done"):
            session.add(WebhookDeliveryAttempt(delivery_id=delivery_id, attempt=1, created_at=OLD))
        for key, created in (("old", OLD), ("new", NEW)):
            session.add(
                IdempotencyRecord(
                    scope="tok",
                    key=key,
                    request_hash="h",
                    state="completed",
                    created_at=created,
                    updated_at=created,
                )
            )
        for hook_id, created in (("hook_old", OLD), ("hook_new", NEW)):
            session.add(
                InboundHookRequest(
                    id=hook_id, source="generic", decision="ignored", reason="r", created_at=created
                )
            )
        # Intents: one that ended long ago (pruned), one standing since long ago, one ended lately.
        for intent_id, ended in (("int_ended_old", OLD), ("int_standing_old", None), ("int_ended_new", NEW)):
            session.add(
                ScaleIntentRow(
                    id=intent_id,
                    deployment_id="dep_x",
                    source="generic",
                    stream="s",
                    state="withdrawn" if ended else "pending",
                    target_dp_size=2,
                    requested_dp_size=2,
                    created_at=OLD,
                    last_seen_at=OLD,
                    ended_at=ended,
                )
            )
        session.commit()

    pruned = _prune(db_engine, Settings(data_dir=tmp_path, database_url="sqlite://"))
    assert pruned == {
        "hook_requests": 1,
        "scale_intents": 1,
        "webhook_deliveries": 1,
        "outbox_events": 1,
        "idempotency_keys": 1,
        "left_engines": 1,
        "jobs": 0,  # the history is kept unless EPCTL_RETENTION_JOBS_S says otherwise
        "job_events": 0,
    }

    with Session(db_engine) as session:
        assert set(session.exec(select(OutboxEvent.id)).all()) == {
            "msg_old_pending",
            "msg_old_undispatched",
            "msg_new_done",
        }
        assert set(session.exec(select(WebhookDelivery.id)).all()) == {"dlv_old_pending", "dlv_new_done"}
        assert count(session, WebhookDeliveryAttempt) == 2
        assert list(session.exec(select(IdempotencyRecord.key)).all()) == ["new"]
        assert list(session.exec(select(InboundHookRequest.id)).all()) == ["hook_new"]
        assert set(session.exec(select(ScaleIntentRow.id)).all()) == {"int_standing_old", "int_ended_new"}
        assert set(session.exec(select(EngineRow.id)).all()) == {"left_new", "serving_old"}
    assert _prune(db_engine, Settings(data_dir=tmp_path, database_url="sqlite://")) == dict.fromkeys(
        pruned, 0
    )


def _job(job_id: str, deployment_id: str, state: str, at: datetime) -> ReconfigurationJob:
    return ReconfigurationJob(
        id=job_id,
        deployment_id=deployment_id,
        state=state,
        from_dp_size=1,
        to_dp_size=2,
        from_generation=1,
        to_generation=2,
        requested_by="api",
        warmup_policy_requested="auto",
        strategy="background",
        created_at=at,
        updated_at=at,
    )


def test_finished_jobs_past_the_policy_are_deleted_with_their_events_the_newest_and_active_kept(
    db_engine: Engine, tmp_path: Path, deployment_id: str
) -> None:
    """Issue 37: a 1,000,000-job history is bounded by `EPCTL_RETENTION_JOBS_S`; the pass says what it
    removed. Batches of 2 here, so the pass goes through several."""
    from app.jobs.history import prune_finished_jobs

    with Session(db_engine) as session:
        old = [(f"rcfg_0{k}", "succeeded") for k in range(5)] + [
            ("rcfg_05", "failed"),
            ("rcfg_06", "preparing"),
        ]
        newest = [(f"rcfg_1{k}", "succeeded") for k in range(3)]  # old too, but the deployment's newest
        for offset, (job_id, state) in enumerate(old + newest):
            session.add(_job(job_id, deployment_id, state, OLD + timedelta(seconds=offset)))
        session.flush()
        for job_id, _ in old + newest:
            session.add(JobEvent(job_id=job_id, seq=1, kind="created", created_at=OLD))
        session.commit()

    with Session(db_engine) as session:
        found = prune_finished_jobs(session, older_than=NEW, batch=2)
    assert (found.jobs, found.events) == (6, 6)  # rcfg_00..05: the active one and the newest 3 stay
    assert found.newest is not None  # rcfg_05's (SQLite hands it back naive)
    assert found.newest.replace(tzinfo=OLD.tzinfo) == OLD + timedelta(seconds=5)
    with Session(db_engine) as session:
        assert set(session.exec(select(ReconfigurationJob.id)).all()) == {
            "rcfg_06",
            "rcfg_10",
            "rcfg_11",
            "rcfg_12",
        }
        assert count(session, JobEvent) == 4
    settings = Settings(data_dir=tmp_path, database_url="sqlite://", retention_jobs_s=86400.0)
    assert _prune(db_engine, settings)["jobs"] == 0  # nothing left to remove
