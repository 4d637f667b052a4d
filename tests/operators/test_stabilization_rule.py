"""The one rule for competing autoscaler intents (`app.scale.stabilize`), pure: the highest standing ask
wins; a scale-up waits for its window (0 s by default), a scale-down for its window (300 s), neither
while something asks otherwise; each intent moves the deployment at most once; a max step cuts a move."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.deployments.autoscaling import ScalingBehavior, ScalingRules
from app.scale.stabilize import HIGHER_INTENT, MAX_STEP, STABILIZATION_WINDOW, Ask, Moved, decide

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DEFAULTS = ScalingBehavior()


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def ask(name: str, target: int, since_s: float, *, pending: bool = True, ended_s: float | None = None) -> Ask:
    return Ask(name, target, pending, ago(since_s), ago(ended_s) if ended_s is not None else None)


def test_a_scale_up_moves_at_once_by_default() -> None:
    verdict = decide([ask("up", 4, 1)], current=2, behavior=DEFAULTS, now=NOW)
    assert verdict.move is not None and (verdict.move.to, verdict.move.serves) == (4, ("up",))


def test_a_scale_down_waits_until_it_has_stood_for_the_window() -> None:
    verdict = decide([ask("down", 1, 100)], current=2, behavior=DEFAULTS, now=NOW)
    assert verdict.move is None
    hold = verdict.holds["down"]
    assert hold.code == STABILIZATION_WINDOW and hold.until == ago(100) + timedelta(seconds=300)
    later = decide([ask("down", 1, 301)], current=2, behavior=DEFAULTS, now=NOW)
    assert later.move is not None and later.move.to == 1


def test_a_higher_ask_within_the_window_holds_a_scale_down_until_it_leaves_the_window() -> None:
    asks = [ask("busy", 4, 1000, pending=False, ended_s=200), ask("idle", 2, 900)]
    verdict = decide(asks, current=4, behavior=DEFAULTS, now=NOW)
    assert verdict.move is None and verdict.holds["idle"].until == ago(200) + timedelta(seconds=300)
    after = decide(asks, current=4, behavior=DEFAULTS, now=ago(200) + timedelta(seconds=301))
    assert after.move is not None and after.move.to == 2


def test_nothing_scales_down_while_a_standing_intent_asks_for_more() -> None:
    asks = [ask("busy", 4, 1000, pending=False), ask("idle", 2, 900)]
    verdict = decide(asks, current=4, behavior=DEFAULTS, now=NOW)
    assert verdict.move is None and verdict.holds["idle"].code == HIGHER_INTENT
    assert verdict.holds["idle"].until is None


def test_an_acted_intent_never_moves_the_deployment_again() -> None:
    # Its job rolled back (the deployment is still at 2): the intent stands but does not retry.
    assert decide([ask("up", 4, 10, pending=False)], current=2, behavior=DEFAULTS, now=NOW).move is None


def test_an_intent_asking_for_the_current_size_is_at_size() -> None:
    verdict = decide([ask("same", 3, 10)], current=3, behavior=DEFAULTS, now=NOW)
    assert verdict.at_size == ["same"] and verdict.move is None


def test_the_highest_of_several_scale_ups_wins_and_the_lower_waits() -> None:
    verdict = decide([ask("a", 3, 10), ask("b", 4, 5)], current=2, behavior=DEFAULTS, now=NOW)
    assert verdict.move is not None and (verdict.move.to, verdict.move.serves) == (4, ("b",))
    assert verdict.holds["a"].code == HIGHER_INTENT


def test_a_scale_up_window_waits_for_the_ask_to_have_stood() -> None:
    behavior = ScalingBehavior(scale_up=ScalingRules(stabilization_window_s=60))
    assert decide([ask("up", 4, 30)], current=2, behavior=behavior, now=NOW).holds["up"].code == (
        STABILIZATION_WINDOW
    )
    assert decide([ask("up", 4, 61)], current=2, behavior=behavior, now=NOW).move is not None


def test_a_withdrawn_intent_still_counted_while_it_stood() -> None:
    asks = [ask("busy", 4, 100, ended_s=50), ask("idle", 1, 400)]
    verdict = decide(asks, current=2, behavior=DEFAULTS, now=NOW)
    assert verdict.move is None and verdict.holds["idle"].until == ago(50) + timedelta(seconds=300)


def test_the_max_step_cuts_a_move_and_then_holds_until_the_period_passes() -> None:
    behavior = ScalingBehavior(scale_up=ScalingRules(stabilization_window_s=0, max_step=2, period_s=60))
    verdict = decide([ask("up", 8, 1)], current=2, behavior=behavior, now=NOW)
    assert verdict.move is not None and (verdict.move.to, verdict.move.asked) == (4, 8)
    moved = [Moved(at=ago(10), up=2, down=0)]
    held = decide([ask("more", 6, 1)], current=4, behavior=behavior, moves=moved, now=NOW)
    assert held.move is None and held.holds["more"].code == MAX_STEP
    assert held.holds["more"].until == ago(10) + timedelta(seconds=60)


def test_moves_down_within_the_period_raise_the_base_of_a_step_up_as_hpa() -> None:
    # HPA's periodStartReplicas: current - added + removed within the period (2 + 3 = 5), so +1 allows 6.
    behavior = ScalingBehavior(scale_up=ScalingRules(stabilization_window_s=0, max_step=1))
    moved = [Moved(at=ago(10), up=0, down=3)]
    verdict = decide([ask("up", 5, 1)], current=2, behavior=behavior, moves=moved, now=NOW)
    assert verdict.move is not None and verdict.move.to == 5
