"""HPA's rate policies where we borrow HPA's names (issue 36): `Pods` and `Percent` policies bounded from
the size at each period's start, `select_policy` `Max`/`Min`/`Disabled`, HPA's defaults where none is
given; a move beyond the bound is a step, and its intent steps on, period after period, until it is
reached (Alertmanager's repeats are duplicates, so no repeat is needed); a move that rolled back is
retried with backoff, each attempt on a record, until it succeeds. The pure rule as tables, then the
real intake, reconciler and job service with a clock the test moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from sqlmodel import Session, col, select

from app.deployments.autoscaling import ScalingBehavior, ScalingRules
from app.jobs.models import ReconfigurationJob
from app.jobs.states import JobState
from app.scale import desired
from app.scale.hooks.alertmanager import AlertmanagerPayload
from app.scale.hooks.models import HookOutcome, InboundHookRequest
from app.scale.hooks.notifications import handle_alertmanager
from app.scale.intents import ScaleIntentRow
from app.scale.stabilize import DISABLED, MAX_STEP, RETRY_BACKOFF, Ask, Moved, backoff_s, decide, limit
from tests.operators.intent_world import ALERTMANAGER, end_active_job, notification, world

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def rules(**given: Any) -> ScalingRules:
    return ScalingRules.model_validate({"stabilization_window_s": 0.0, **given})


PODS_1 = {"type": "Pods", "value": 1, "period_s": 60.0}
PERCENT_50 = {"type": "Percent", "value": 50, "period_s": 60.0}


@pytest.mark.parametrize(
    ("given", "current", "moves", "up", "bound"),
    [
        # HPA's defaults: up, the larger of +100 % and +4 per 15 s; down, -100 % per 15 s.
        ({}, 2, [], True, 6),
        ({}, 8, [], True, 16),
        ({}, 8, [], False, 0),
        ({"max_step": 1, "period_s": 60.0}, 3, [], False, 2),
        ({"policies": [PERCENT_50]}, 4, [], True, 6),
        ({"policies": [PERCENT_50]}, 3, [], True, 5),  # 4.5 rounded up
        ({"policies": [PERCENT_50]}, 3, [], False, 1),  # 1.5 rounded down
        # Max (the default): the loosest; Min: the tightest.
        ({"policies": [PODS_1, PERCENT_50]}, 4, [], True, 6),
        ({"policies": [PODS_1, PERCENT_50], "select_policy": "Min"}, 4, [], True, 5),
        ({"policies": [PODS_1, PERCENT_50], "select_policy": "Min"}, 4, [], False, 3),
        # Moves within the period count from the period's start; older ones do not.
        ({"policies": [PODS_1]}, 3, [Moved(ago(30), up=0, down=1)], False, 3),
        ({"policies": [PODS_1]}, 3, [Moved(ago(61), up=0, down=1)], False, 2),
        ({"policies": [PERCENT_50]}, 6, [Moved(ago(10), up=2, down=0)], True, 6),
        ({"select_policy": "Disabled"}, 4, [], True, 4),
    ],
)
def test_the_bound_of_the_rate_policies(
    given: dict[str, Any], current: int, moves: list[Moved], up: bool, bound: int
) -> None:
    assert limit(rules(**given), moves, NOW, current, up)[0] == bound


def test_a_move_beyond_the_bound_is_a_step_and_the_next_period_steps_on() -> None:
    behavior = ScalingBehavior(scale_down=rules(max_step=1, period_s=60.0))
    asks = [Ask("down", 1, True, ago(400))]
    first = decide(asks, current=3, behavior=behavior, now=NOW)
    assert first.move is not None and (first.move.to, first.move.asked, first.move.step) == (2, 1, True)
    moved = [Moved(NOW, up=0, down=1)]
    held = decide(asks, current=2, behavior=behavior, moves=moved, now=NOW + timedelta(seconds=30))
    assert held.move is None and held.holds["down"].code == MAX_STEP
    assert held.holds["down"].until == NOW + timedelta(seconds=60)
    last = decide(asks, current=2, behavior=behavior, moves=moved, now=NOW + timedelta(seconds=61))
    assert last.move is not None and (last.move.to, last.move.step) == (1, False)


def test_disabled_never_moves_that_way() -> None:
    behavior = ScalingBehavior(scale_up=rules(select_policy="Disabled"))
    verdict = decide([Ask("up", 4, True, ago(1))], current=2, behavior=behavior, now=NOW)
    assert verdict.move is None and verdict.holds["up"].code == DISABLED


def test_a_failed_move_waits_for_its_backoff() -> None:
    asks = [Ask("up", 4, True, ago(100), retry_at=NOW + timedelta(seconds=5))]
    verdict = decide(asks, current=2, behavior=ScalingBehavior(), now=NOW)
    assert verdict.move is None and verdict.holds["up"].code == RETRY_BACKOFF
    later = decide(asks, current=2, behavior=ScalingBehavior(), now=NOW + timedelta(seconds=5))
    assert later.move is not None and later.move.to == 4


@pytest.mark.parametrize(
    ("attempts", "seconds"), [(0, 0.0), (1, 30.0), (2, 60.0), (3, 120.0), (6, 600.0), (40, 600.0)]
)
def test_the_backoff_doubles_to_ten_minutes(attempts: int, seconds: float) -> None:
    assert backoff_s(attempts) == seconds


@pytest.mark.parametrize(
    "bad",
    [
        {"policies": [{"type": "Replicas", "value": 1, "period_s": 60}]},
        {"policies": [{"type": "Pods", "value": 0, "period_s": 60}]},
        {"policies": [{"type": "Percent", "value": 10, "period_s": 1801}]},
        {"select_policy": "Largest"},
    ],
)
def test_malformed_policies_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ScalingBehavior.model_validate({"scale_up": bad})


# --- through the intake and the reconciler ----------------------------------------------------------


def _alert(session: Session, labels: dict[str, str], status: str = "firing") -> HookOutcome:
    body = notification("Idle", 0, ("a",), labels, status)
    [result] = handle_alertmanager(session, ALERTMANAGER, AlertmanagerPayload.model_validate(body)).results
    return result


def _jobs(session: Session) -> list[tuple[int, int, str]]:
    rows = session.exec(select(ReconfigurationJob).order_by(col(ReconfigurationJob.created_at))).all()
    return [(j.from_dp_size, j.to_dp_size, j.state) for j in rows]


def _codes(session: Session, intent_id: str) -> list[str]:
    rows = session.exec(
        select(InboundHookRequest)
        .where(col(InboundHookRequest.intent_id) == intent_id)
        .order_by(col(InboundHookRequest.created_at))
    ).all()
    return [str((r.payload or {}).get("code", r.decision)) for r in rows]


def test_alertmanager_with_max_step_1_reaches_the_ask_one_step_per_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    behavior = {"scale_down": {"stabilization_window_s": 0.0, "max_step": 1, "period_s": 60.0}}
    with world(monkeypatch, behavior, 0.0, current=3) as (session, clock):
        first = _alert(session, {"target_dp_size": "1"})
        assert (first.decision, first.code) == ("accepted", "stepping")
        end_active_job(session, JobState.succeeded)
        clock.now += timedelta(seconds=30)
        assert _alert(session, {"target_dp_size": "1"}).code == "duplicate"  # a repeat: nothing new
        assert desired.reconcile(session, now=clock.now) == []  # the period is not over
        clock.now += timedelta(seconds=31)
        [second] = desired.reconcile(session, now=clock.now)  # no repeat needed
        assert (second.from_dp_size, second.to_dp_size) == (2, 1)
        end_active_job(session, JobState.succeeded)
        intent = session.get(ScaleIntentRow, first.intent_id)
        assert intent is not None and (intent.state, intent.job_id) == ("acted", second.id)
        assert _jobs(session) == [(3, 2, "succeeded"), (2, 1, "succeeded")]
        assert "scaling" in _codes(session, intent.id)  # the last step's record
        clock.now += timedelta(seconds=120)
        assert desired.reconcile(session, now=clock.now) == []


def test_a_rolled_back_move_is_retried_with_backoff_until_it_succeeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with world(monkeypatch, {}, 0.0, current=2) as (session, clock):
        asked = _alert(session, {"target_dp_size": "4"})
        assert asked.decision == "accepted"
        end_active_job(session, JobState.rolled_back)  # e.g. a launch timeout under load
        assert desired.reconcile(session, now=clock.now) == []  # recorded, and waits for its backoff
        intent = session.get(ScaleIntentRow, asked.intent_id)
        assert intent is not None and (intent.state, intent.attempts) == ("pending", 1)
        assert intent.retry_at is not None
        clock.now += timedelta(seconds=29)
        assert desired.reconcile(session, now=clock.now) == []
        clock.now += timedelta(seconds=2)
        [again] = desired.reconcile(session, now=clock.now)
        end_active_job(session, JobState.rolled_back)
        desired.reconcile(session, now=clock.now)
        session.refresh(intent)
        assert intent.attempts == 2  # the second wait is 60 s
        clock.now += timedelta(seconds=59)
        assert desired.reconcile(session, now=clock.now) == []
        clock.now += timedelta(seconds=2)
        [third] = desired.reconcile(session, now=clock.now)
        end_active_job(session, JobState.succeeded)
        assert desired.reconcile(session, now=clock.now) == []
        session.refresh(intent)
        assert (intent.state, intent.job_id, again.to_dp_size, third.to_dp_size) == ("acted", third.id, 4, 4)
        assert _codes(session, intent.id).count("retrying") == 2
        assert [state for *_, state in _jobs(session)] == ["rolled_back", "rolled_back", "succeeded"]


def test_a_window_hold_quotes_the_ask_that_holds_it_longest() -> None:
    # 4 stood until 200 s ago, 3 until 50 s ago: it is 3 that keeps 2 waiting (until 250 s from now).
    asks = [
        Ask("busy", 4, False, ago(1000), ago(200)),
        Ask("calmer", 3, False, ago(200), ago(50)),
        Ask("idle", 2, True, ago(900)),
    ]
    hold = decide(asks, current=4, behavior=ScalingBehavior(), now=NOW).holds["idle"]
    assert hold.until == ago(50) + timedelta(seconds=300)
    assert hold.reason.startswith("the ask was 3 within the scale-down window")
