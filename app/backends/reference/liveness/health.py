"""Whether a deployment is whole, from what its engines report (pure).

A deployment of size N at generation G is whole when exactly N of its engines report serving (or paused)
on G, on ranks 0..N-1, and none serves (or is paused on) another generation. Engines tell this in their
heartbeats (state, generation, rank); one that stops heartbeating becomes `unreachable`, one whose group
broke reports itself idle on no generation. An engine that refuses the coordinator's agent key is never
counted as serving (the coordinator cannot control it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.backends.reference.liveness.view import EngineSeen
from app.deployments.engines.models import SERVING_STATES, EngineState

REASON_UNREACHABLE = "engine-unreachable"
REASON_MEMBERS_MISSING = "members-missing"
REASON_GENERATION_SPLIT = "generation-split"
REASON_STALLED = "engine-stalled"
REASON_NO_SURVIVORS = "no-survivors"
REASON_HEAL_STOPPED = "self-heal-stopped"
REASON_KEY_REFUSED = "engine-refuses-agent-key"
# The reasons health itself gives, and so keeps true as the engines change (another's is theirs).
HEALTH_REASONS = frozenset(
    {REASON_UNREACHABLE, REASON_MEMBERS_MISSING, REASON_GENERATION_SPLIT, REASON_KEY_REFUSED}
)
HEALTH_HINT = (
    "the deployment cannot serve until its group is whole: restart or replace the engines, "
    "or scale it to form a new generation on the engines that serve"
)


@dataclass(frozen=True)
class Health:
    """What the engines say about one deployment."""

    whole: bool
    serving: int  # engines that serve the deployment's generation
    reason: str | None = None
    message: str = ""


def serves(engine: EngineSeen, generation: int) -> bool:
    """It serves (or is paused on) `generation`, under the coordinator's control."""
    return engine.generation == generation and engine.state in SERVING_STATES and not engine.refuses_agent_key


def assess(size: int, generation: int, engines: Iterable[EngineSeen]) -> Health:
    """Whether the engines (the deployment's, not `left`) say the deployment is whole."""
    engines = list(engines)
    on_generation = [e for e in engines if serves(e, generation)]
    ranks = sorted(e.dp_rank for e in on_generation if e.dp_rank is not None)
    # An engine serving another generation is a second group beside the deployment's (a switch that
    # failed part-way): the deployment is not whole even when its own generation is.
    strays = sorted(
        f"{e.id} (generation {e.generation})"
        for e in engines
        if e.generation != generation and e.state in SERVING_STATES
    )
    own_whole = len(on_generation) == size and ranks == list(range(size))
    if own_whole and not strays:
        return Health(whole=True, serving=size)
    unreachable = sorted(e.id for e in engines if e.state == EngineState.unreachable.value)
    left_group = sorted(
        e.id
        for e in engines
        if e.generation != generation and e.state == EngineState.idle.value and e.dp_rank is None
    )
    fenced = sorted(e.id for e in engines if e.state == EngineState.fenced.value)
    refusing = sorted(e.id for e in engines if e.refuses_agent_key)
    parts = [f"{len(on_generation)} of {size} engines serve generation {generation}"]
    if unreachable:
        parts.append(f"unreachable: {', '.join(unreachable)}")
    if fenced:
        parts.append(f"fenced (stalled): {', '.join(fenced)}")
    if refusing:
        parts.append(f"refusing the agent key: {', '.join(refusing)}")
    if len(on_generation) > size or len(set(ranks)) != len(ranks) or own_whole:
        # Two claims on one rank, or a whole generation with a second group beside it.
        reason = REASON_GENERATION_SPLIT
        parts.append(f"ranks reported: {ranks}")
    elif unreachable:
        reason = REASON_UNREACHABLE
    elif refusing:
        reason = REASON_KEY_REFUSED
    else:
        # A member missing is the reason even with a stray beside it: self-healing re-forms the
        # generation on what there is (a stray's fenced group ends at its first collective's deadline).
        reason = REASON_MEMBERS_MISSING
        if left_group:
            parts.append(f"on no generation: {', '.join(left_group)}")
    if strays:
        parts.append(f"serving another generation: {', '.join(strays)}")
    return Health(whole=False, serving=len(on_generation), reason=reason, message="; ".join(parts))
