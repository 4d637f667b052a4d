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
- **Max step**: autoscaler moves within `period_s` add (or remove) at most `max_step` engines; a move
  asking for more is cut to what is left, and the intents it serves count as acted on.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.deployments.autoscaling import ScalingBehavior, ScalingRules

STABILIZATION_WINDOW = "stabilization-window"
HIGHER_INTENT = "higher-intent"
MAX_STEP = "max-step"


@dataclass(frozen=True)
class Ask:
    """An intent as the rule sees it: what it asks for, whether it may still move the deployment, and
    when it stood."""

    intent_id: str
    target: int
    pending: bool
    since: datetime
    until: datetime | None = None  # when it ended; None while it stands

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
    asked: int  # the size they asked for (above `to` when cut by the max step)
    note: str


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


def _room(
    rules: ScalingRules, moves: Sequence[Moved], now: datetime, up: bool
) -> tuple[int | None, datetime | None]:
    """Engines the step policy still lets autoscalers move this way now (None: no limit), and when the
    oldest move in the period leaves it."""
    if rules.max_step is None:
        return None, None
    start = now - timedelta(seconds=rules.period_s)
    counted = [m for m in moves if m.at > start and (m.up if up else m.down) > 0]
    used = sum(m.up if up else m.down for m in counted)
    frees = min(m.at for m in counted) + timedelta(seconds=rules.period_s) if counted else None
    return rules.max_step - used, frees


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
        other = min(s[2] for s in against) if up else max(s[2] for s in against)
        hold = Hold(
            STABILIZATION_WINDOW,
            f"the ask was {other} within the {direction} window of {window_s:g} s: {target} waits until "
            f"{until.isoformat(timespec='seconds')}",
            until,
        )
        for ask in chosen:
            verdict.holds[ask.intent_id] = hold
        return verdict
    room, frees = _room(rules, moves, now, up)
    to, note = target, f"the highest ask is {target}"
    if room is not None:
        if room <= 0:
            hold = Hold(
                MAX_STEP,
                f"autoscalers moved {rules.max_step} engine(s) {'up' if up else 'down'} within "
                f"{rules.period_s:g} s (max_step): waits until {_when(frees)}",
                frees,
            )
            for ask in chosen:
                verdict.holds[ask.intent_id] = hold
            return verdict
        step = abs(target - current)
        if step > room:
            to = current + room if up else current - room
            note = f"asked for {target}, cut to {to} by max_step {rules.max_step} per {rules.period_s:g} s"
    verdict.move = Move(to=to, serves=tuple(a.intent_id for a in chosen), asked=target, note=note)
    return verdict


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else "?"
