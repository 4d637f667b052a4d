"""Issue 26, the property: over any sequence of notifications (repeats, resolves, new episodes, alerts
joining and leaving a group, generic requests and withdrawals, operator scales, jobs ending, time
passing through cooldowns and windows, pauses), the autoscaler jobs that reach their intent's size never
outnumber the distinct intents (issue 36: a rate policy's steps and the retries of a rolled-back move are
more jobs for one intent, each on its record), and no job runs for an intent that was withdrawn or
superseded.

Runs the real intake (`app.scale.hooks.decide`), reconciler (`app.scale.desired`) and job service on a real
SQLite database (in memory, one per example), with the clock each of them reads moved by the test."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import Session, col, select

from app.core.ids import new_ulid
from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import create_reconfiguration
from app.jobs.states import JobState
from app.scale import desired
from app.scale.hooks.alertmanager import AlertmanagerPayload
from app.scale.hooks.decide import decide
from app.scale.hooks.models import HookSource, InboundHookRequest
from app.scale.hooks.notifications import handle_alertmanager
from app.scale.hooks.service import Caller, ScaleRequest
from app.scale.intents import ScaleIntentRow
from tests.operators.intent_world import ALERTMANAGER, Clock, end_active_job, notification, world

GROUPS = ("busy", "idle")
asks = st.sampled_from(
    [
        {"target_dp_size": "1"},
        {"target_dp_size": "3"},
        {"target_dp_size": "4"},
        {"step": "+1"},
        {"step": "-1"},
    ]
)
groups = st.sampled_from(GROUPS)
# Weighted towards what can go wrong: asks, their repeats and resolutions, and time passing.
ACTION = {
    "fire": st.tuples(
        st.just("fire"), groups, st.integers(0, 1), st.sampled_from([("a",), ("a", "b")]), asks
    ),
    "resolve": st.tuples(st.just("resolve"), groups, st.integers(0, 1)),
    "repeat": st.tuples(st.just("repeat")),
    "generic": st.tuples(st.just("generic"), st.sampled_from(["x", "y"]), st.sampled_from([1, 3, 4, None])),
    "operator": st.tuples(st.just("operator"), st.integers(1, 4)),
    "end-job": st.tuples(st.just("end-job"), st.sampled_from([JobState.succeeded, JobState.rolled_back])),
    "wait": st.tuples(st.just("wait"), st.sampled_from([20, 70, 400])),
    "pause": st.tuples(st.just("pause"), st.booleans()),
}
WEIGHTS = ["fire"] * 4 + ["resolve"] * 3 + ["repeat"] * 2 + ["wait"] * 3 + ["end-job"] * 2
WEIGHTS += ["generic", "operator", "pause"]
actions = st.sampled_from(WEIGHTS).flatmap(lambda kind: ACTION[kind])
behaviors = st.fixed_dictionaries(
    {
        "scale_down": st.fixed_dictionaries(
            {
                "stabilization_window_s": st.sampled_from([0.0, 60.0, 300.0]),
                "max_step": st.sampled_from([None, 1]),
            }
        ),
        "scale_up": st.fixed_dictionaries(
            {
                "stabilization_window_s": st.sampled_from([0.0, 30.0]),
                "max_step": st.sampled_from([None, 1, 2]),
            }
        ),
    }
)


@dataclass
class Step:
    """One action as the test sees it, and the ids made while it ran (ids sort by creation)."""

    kind: str
    group: str | None = None
    identity: tuple[Any, ...] | None = None  # a firing ask: what makes a repeat a duplicate
    first_id: str = ""
    last_id: str = ""


def run(session: Session, clock: Clock, steps: list[tuple[Any, ...]]) -> list[Step]:
    done: list[Step] = []
    last: tuple[dict[str, Any], Step] | None = None
    for action in steps:
        kind = action[0]
        step = Step(kind, first_id=new_ulid())
        if kind == "fire":
            _, group, episode, members, labels = action
            step.group, step.identity = group, (group, episode, members, tuple(sorted(labels.items())))
            last = (notification(group, episode, members, labels, "firing"), step)
        elif kind == "resolve":
            _, group, episode = action
            step.group = group
            last = (notification(group, episode, ("a", "b"), {"step": "+1"}, "resolved"), step)
        elif kind == "repeat" and last is not None:
            step.kind, step.group, step.identity = last[1].kind, last[1].group, last[1].identity
        if kind in ("fire", "resolve", "repeat") and last is not None:
            handle_alertmanager(session, ALERTMANAGER, AlertmanagerPayload.model_validate(last[0]))
        elif kind == "generic":
            _, group, size = action
            body: dict[str, Any] = {"deployment": "d1", "group": group}
            body.update({"target_dp_size": size} if size else {"status": "resolved"})
            step.group = f"generic:{group}"
            step.kind = "fire" if size else "resolve"
            step.identity = ("generic", len(done)) if size else None  # a bearer request: always new
            caller = Caller(HookSource.generic, requester="keda")
            decide(session, caller, ScaleRequest.model_validate(body).ask(caller))
        elif kind == "operator":
            try:
                create_reconfiguration(
                    session,
                    request=ReconfigurationCreate(deployment="d1", target_dp_size=action[1]),
                    requested_by=RequestSource.api,
                    on_created=desired.supersede_for_job,
                )
            except Exception:
                session.rollback()  # an active job, or already at that size: refused, as the API would
                step.kind = "refused"
        elif kind == "end-job":
            end_active_job(session, action[1])
        elif kind == "wait":
            clock.now += timedelta(seconds=action[1])
        elif kind == "pause":
            deployment = session.exec(select(Deployment)).one()
            deployment.autoscale_paused = action[1]
            session.add(deployment)
            session.commit()
        desired.reconcile(session, now=clock.now)
        step.last_id = new_ulid()
        done.append(step)
    return done


def _ulid(any_id: str) -> str:
    return any_id.rpartition("_")[2].lower()


def _during(steps: list[Step], any_id: str) -> int:
    """The index of the step during which the row with this id was made."""
    key = _ulid(any_id)
    return next(i for i, step in enumerate(steps) if _ulid(step.first_id) <= key <= _ulid(step.last_id))


def check(session: Session, steps: list[Step]) -> None:
    """Judged from the test's own account of what was asked, not from the coordinator's bookkeeping."""
    distinct = {step.identity for step in steps if step.kind == "fire"}
    jobs = session.exec(
        select(ReconfigurationJob).where(
            col(ReconfigurationJob.requested_by) == RequestSource.autoscaler.value
        )
    ).all()
    intents = {i.id: i for i in session.exec(select(ScaleIntentRow)).all()}
    records = {r.id: r for r in session.exec(select(InboundHookRequest)).all()}
    # Every job is on a record of the intent it moved for (a rate policy's step, a retry, the last move).
    served_by = {job.id: {r.intent_id for r in records.values() if r.job_id == job.id} for job in jobs}
    # Each intent is reached at most once: jobs that went to their intent's size and did not fail.
    reached = [
        job
        for job in jobs
        if job.state not in (JobState.rolled_back.value, JobState.failed.value)
        and any(intents[i].target_dp_size == job.to_dp_size for i in served_by[job.id] if i in intents)
    ]
    assert len(reached) <= len(distinct), (len(reached), len(distinct))
    for job in jobs:
        served = [intents[i] for i in served_by[job.id] if i in intents]
        assert served, f"autoscaler job {job.id} serves no intent"
        for intent in served:
            asked = _during(steps, intent.id)
            group = steps[asked].group
            assert steps[asked].kind == "fire" and records[intent.request_id or ""].duplicate_of is None
            # Nothing between the ask and its job withdrew or superseded it: no resolution or newer ask of
            # its group, no operator job.
            for later in steps[asked + 1 : _during(steps, job.id) + 1]:
                assert later.kind != "operator", f"job {job.id} ran for an intent an operator superseded"
                if later.group == group:
                    assert later.kind != "resolve", f"job {job.id} ran for a withdrawn intent"
                    assert later.identity == steps[asked].identity, f"job {job.id} ran for a replaced intent"


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(actions, min_size=1, max_size=24),
    behavior=behaviors,
    cooldown_s=st.sampled_from([0.0, 60.0, 60.0]),
)
def test_jobs_never_outnumber_intents_and_never_serve_a_withdrawn_or_superseded_one(
    monkeypatch: pytest.MonkeyPatch, steps: list[tuple[Any, ...]], behavior: dict[str, Any], cooldown_s: float
) -> None:
    with world(monkeypatch, behavior, cooldown_s) as (session, clock):
        check(session, run(session, clock, steps))
