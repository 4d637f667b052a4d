"""The one rule for competing autoscaler intents: pure, no database (`app.scale.desired` feeds it).

Modelled on Kubernetes' HPA `behavior`, with one difference an EP group needs (every move stops every
engine): a move always goes to a size some pending intent asked for, never to a size in between.

- Every intent stands from when it was asked until it ends. The *ask* at a moment is the highest size
  any intent standing then asks for (as HPA takes the highest of its metrics' proposals); a moment when
  none stands asks for the current size.
- An intent asking for the current size is acted on by finding it there. Only pending intents move the
  deployment, each at most once.
- **Up**: if a pending intent asks for more than the current size, the move goes to the highest such
  size M, once the ask has been at least M for the whole scale-up window (default 0 s: at once).
- **Down**: otherwise, if the highest standing ask M is below the current size and a pending intent
  asks for it, the move goes to M once the ask has been at most M for the whole scale-down window
  (default 300 s). While a standing intent asks for more, nothing scales down.
- **Rate policies** (HPA's `policies` and `selectPolicy`; `max_step` is a `Pods` policy): each policy
  bounds the size from the size at its period's start (the current size less what autoscaler moves
  added within the period, plus what they removed): `Pods` by `value` engines, `Percent` by `value`
  percent (up rounded up, down rounded down, as HPA); `Max` applies the loosest bound, `Min` the
  tightest, `Disabled` forbids the direction. A move asking beyond the bound goes to the bound and is a
  *step*: its intents stay pending, and the next period steps again, until the ask is reached.
- **Retries**: a pending intent whose move failed or rolled back waits until its `retry_at`
  (`backoff_s`), then moves again.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.deployments.autoscaling import ScalingBehavior, ScalingPolicy, ScalingRules

STABILIZATION_WINDOW = "stabilization-window"
HIGHER_INTENT = "higher-intent"
MAX_STEP = "max-step"
DISABLED = "select-policy-disabled"
RETRY_BACKOFF = "retry-backoff"
RETRY_BASE_S = 30.0
RETRY_MAX_S = 600.0


def backoff_s(attempts: int) -> float:
    """How long after its n-th failed move an intent waits before the next: 30 s doubling, at most
    10 min (on top of the deployment's cooldown, which counts from the failed job too)."""
    if attempts <= 0:
        return 0.0
    return min(RETRY_MAX_S, RETRY_BASE_S * 2 ** min(attempts - 1, 16))


@dataclass(frozen=True)
class Ask:
    """An intent as the rule sees it: what it asks for, whether it may still move the deployment, and
    when it stood."""

    intent_id: str
    target: int
    pending: bool
    since: datetime
    until: datetime | None = None  # when it ended; None while it stands
    retry_at: datetime | None = None  # a failed move for it is retried from then

    def stands_at(self, moment: datetime) -> bool:
        return self.since <= moment and (self.until is None or self.until > moment)


@dataclass(frozen=True)
class Moved:
    """An autoscaler job of the deployment within a step period: when, and how far each way."""

    at: datetime
    up: int
    down: int


@dataclass(frozen=True)
class Hold:
    code: str
    reason: str
    until: datetime | None = None


@dataclass(frozen=True)
class Move:
    to: int
    serves: tuple[str, ...]  # the pending intents acted on by it
    asked: int  # the size they asked for (beyond `to` when a rate policy makes this a step)
    note: str

    @property
    def step(self) -> bool:
        """A step toward the ask, not the ask: its intents stay pending for the next period."""
        return self.to != self.asked


@dataclass
class Verdict:
    move: Move | None = None
    at_size: list[str] = field(default_factory=list)  # pending intents asking for the current size
    holds: dict[str, Hold] = field(default_factory=dict)  # every other pending intent: why it waits


def _ask_at(asks: Sequence[Ask], moment: datetime, current: int) -> int:
    standing = [a.target for a in asks if a.stands_at(moment)]
    return max(standing) if standing else current


def _window(
    asks: Sequence[Ask], start: datetime, now: datetime, current: int
) -> list[tuple[datetime, datetime, int]]:
    """The ask over [start, now] as segments (left, right, ask); the last one ends at `now`."""
    points = {start, now}
    for ask in asks:
        for moment in (ask.since, ask.until):
            if moment is not None and start < moment < now:
                points.add(moment)
    ordered = sorted(points)
    segments = [(left, right, _ask_at(asks, left, current)) for left, right in itertools.pairwise(ordered)]
    segments.append((now, now, _ask_at(asks, now, current)))
    return segments


def _period_start(policy: ScalingPolicy, moves: Sequence[Moved], now: datetime, current: int) -> int:
    """The size at the policy's period start (HPA's periodStartReplicas)."""
    start = now - timedelta(seconds=policy.period_s)
    counted = [m for m in moves if m.at > start]
    return current - sum(m.up for m in counted) + sum(m.down for m in counted)


def _bound(policy: ScalingPolicy, base: int, up: bool) -> int:
    if policy.type == "Pods":
        return base + policy.value if up else base - policy.value
    if up:  # rounded up, or a small group could never grow (HPA)
        return math.ceil(base * (1 + policy.value / 100))
    return math.floor(base * (1 - policy.value / 100))


def limit(
    rules: ScalingRules, moves: Sequence[Moved], now: datetime, current: int, up: bool
) -> tuple[int, datetime | None]:
    """The furthest size the rate policies let autoscalers move to now (never past `current` the other
    way; `current` itself: no room), and when the oldest move they count leaves its period."""
    if rules.select_policy == "Disabled":
        return current, None
    policies = rules.effective_policies(up)
    bounds = [_bound(p, _period_start(p, moves, now, current), up) for p in policies]
    loosest = rules.select_policy == "Max"
    if up:
        bound = max(bounds) if loosest else min(bounds)
        bound = max(bound, current)
    else:
        bound = min(bounds) if loosest else max(bounds)
        bound = min(bound, current)
    leaving = [
        m.at + timedelta(seconds=p.period_s)
        for p in policies
        for m in moves
        if m.at > now - timedelta(seconds=p.period_s)
    ]
    return bound, min(leaving) if leaving else None


def decide(
    asks: Sequence[Ask],
    *,
    current: int,
    behavior: ScalingBehavior,
    moves: Sequence[Moved] = (),
    now: datetime,
) -> Verdict:
    verdict = Verdict()
    pending = [a for a in asks if a.pending and a.stands_at(now)]
    verdict.at_size = [a.intent_id for a in pending if a.target == current]
    movers = [a for a in pending if a.target != current]
    if not movers:
        return verdict
    ask_now = _ask_at(asks, now, current)
    ups = [a for a in movers if a.target > current]
    up = bool(ups)
    if up:
        target = max(a.target for a in ups)
        rules = behavior.scale_up
    else:
        target = max(a.target for a in movers)
        rules = behavior.scale_down
    chosen = [a for a in movers if a.target == target]
    others = [a for a in movers if a.target != target]
    for ask in others:
        verdict.holds[ask.intent_id] = Hold(
            HIGHER_INTENT, f"another intent asks for {max(ask_now, target)}: the highest ask wins"
        )
    if not up and ask_now > target:
        hold = Hold(HIGHER_INTENT, f"a standing intent asks for {ask_now}: nothing scales down below it")
        for ask in chosen:
            verdict.holds[ask.intent_id] = hold
        return verdict
    window_s = rules.stabilization_window_s
    segments = _window(asks, now - timedelta(seconds=window_s), now, current)
    against = [s for s in segments if (s[2] < target if up else s[2] > target)]
    if against:
        last_end = max(s[1] for s in against)
        until = last_end + timedelta(seconds=window_s)
        direction = "scale-up" if up else "scale-down"
        other = max(against, key=lambda s: s[1])[2]  # the ask that holds it longest: the latest against
        hold = Hold(
            STABILIZATION_WINDOW,
            f"the ask was {other} within the {direction} window of {window_s:g} s: {target} waits until "
            f"{until.isoformat(timespec='seconds')}",
            until,
        )
        for ask in chosen:
            verdict.holds[ask.intent_id] = hold
        return verdict
    waiting = [a for a in chosen if a.retry_at is not None and a.retry_at > now]
    if waiting:
        retry_at = max(a.retry_at for a in waiting if a.retry_at is not None)
        hold = Hold(
            RETRY_BACKOFF, f"the last move to {target} failed: tried again from {_when(retry_at)}", retry_at
        )
        for ask in chosen:
            verdict.holds[ask.intent_id] = hold
        return verdict
    bound, frees = limit(rules, moves, now, current, up)
    to = min(target, bound) if up else max(target, bound)
    direction = "up" if up else "down"
    if to == current:
        if rules.select_policy == "Disabled":
            hold = Hold(DISABLED, f"select_policy Disabled: autoscalers never scale {direction}")
        else:
            hold = Hold(
                MAX_STEP,
                f"the {direction} rate policies ({_policies(rules, up)}) allow no more within their "
                f"period: waits until {_when(frees)}",
                frees,
            )
        for ask in chosen:
            verdict.holds[ask.intent_id] = hold
        return verdict
    note = f"the highest ask is {target}"
    if to != target:
        note = f"asked for {target}, a step to {to} by {_policies(rules, up)}; the next period steps on"
    verdict.move = Move(to=to, serves=tuple(a.intent_id for a in chosen), asked=target, note=note)
    return verdict


def _policies(rules: ScalingRules, up: bool) -> str:
    shown = [
        f"{p.value}{' %' if p.type == 'Percent' else ''} per {p.period_s:g} s"
        for p in rules.effective_policies(up)
    ]
    return f"{rules.select_policy} of " + ", ".join(shown) if len(shown) > 1 else shown[0]


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else "?"
