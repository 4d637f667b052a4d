"""Evidence about single engines, from what their peers report (pure).

- A member that **stalled**: when an EP group breaks on a serving deadline, its live members leave it and
  each reports, in its next heartbeats, the generation that broke and which other members did not answer
  its health probe (`engine_agent.peer_check`). A member every other member named, and not heard from
  since the first report, is frozen: it is fenced within about a second of the serving deadline, not at
  its heartbeat timeout (a member that left the generation before it broke, as a leaver inside a commit
  window, has nothing to say). Fenced is not dead: it is not stopped, and one that comes back (heartbeats
  again, idle) within the grace is re-admitted by the grow-back; a thawed engine can never serve the
  fenced generation (every other member left its group, and generations are never reused).
- A member **frozen** while serving (issue 39): every other member of its generation reports, in a
  heartbeat sent at once, that it has waited on one of the generation's serving collectives past the slow
  mark (far above a step) and that its own health probe of this one got no answer; this one reports no
  such wait and was not heard from since they started waiting (a SIGSTOPped process stops its heartbeat
  and its HTTP server with its serving loop); and the coordinator's own probe of it, started since, got
  no answer either. Fenced then, about a second and a half after the freeze, and the survivors told to
  leave the group at once rather than wait out the serving deadline. A member that is only slow still
  heartbeats and answers (any probe that answers clears it); a lost control link leaves its peers
  stepping (no one is stuck); a cut data link leaves it stuck too (no suspect).
- A member whose **peers vouch** for it: every other member of its generation heartbeats, serves it with
  no break and has counted more lock-step iterations than it last reported (each one a collective with
  it), so it steps with them and only the coordinator cannot hear it: its control link is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.backends.reference.liveness.health import serves
from app.backends.reference.liveness.view import EngineSeen, Reply
from app.core.shedding import heard_at
from app.deployments.engines.models import EngineState


def stalled_members(
    size: int, generation: int, engines: Sequence[EngineSeen]
) -> list[tuple[EngineSeen, list[str]]]:
    """The members of `generation` that every other member named when its group broke, and that were
    not heard from since, each with who named it."""
    reporters = [e for e in engines if e.broken_generation == generation and e.broken_reported_at]
    if not reporters:
        return []
    still_on = [e for e in engines if serves(e, generation) and e.broken_generation != generation]
    first_report = min(e.broken_reported_at for e in reporters if e.broken_reported_at is not None)
    # Off the generation before it broke (a leaver that switched inside a commit window the frozen member
    # held open, issue 34): idle on another generation and heard since the first report with no break
    # to report (a member of the group when it broke says so in its first heartbeat after), it was no
    # member to speak.
    departed = [
        e
        for e in engines
        if e.state == EngineState.idle.value
        and e.generation != generation
        and e.broken_generation != generation
        and e.last_heartbeat_at is not None
        and e.last_heartbeat_at >= first_report
    ]
    if len(reporters) + len(still_on) + len(departed) < size:
        return []  # not every member spoke yet (or some left otherwise): no verdict
    found = []
    for engine in still_on:
        others = [e for e in reporters if e.id != engine.id]
        named = others and all(engine.id in e.unresponsive_peers for e in others)
        silent = engine.last_heartbeat_at is None or engine.last_heartbeat_at < first_report
        if named and silent:
            found.append((engine, [e.id for e in others]))
    return found


def peers_vouch(
    size: int, generation: int, engine: EngineSeen, engines: Sequence[EngineSeen], fresh_since: datetime
) -> bool:
    """Every other member of the engine's generation heard from since `fresh_since`, serving it with no
    break, and counted past it (see the module doc)."""
    if engine.dp_rank is None or engine.generation != generation:
        return False
    others = [
        e for e in engines if e.generation == generation and e.dp_rank is not None and e.id != engine.id
    ]
    if not others or len(others) != size - 1:
        return False
    return all(
        serves(other, generation)
        and other.last_heartbeat_at is not None
        and other.last_heartbeat_at >= fresh_since
        and other.broken_generation != generation
        and other.group_steps > engine.group_steps
        for other in others
    )


# A heartbeat is recorded when the coordinator handles it, up to this long after it was sent (a loaded
# host's): one recorded this long after the others got stuck was sent while they waited. One recorded
# sooner may have left before the freeze (seen on the 2-core machine); the probes judge that case.
HEARTBEAT_LATENCY_S = 1.0


@dataclass(frozen=True)
class Suspect:
    """The one member of a generation that every other member waits on (see the module doc)."""

    engine: EngineSeen
    waiting: tuple[EngineSeen, ...]  # every other member, each stuck in a serving collective
    since: datetime  # the earliest of their waits' starts


def freeze_suspect(size: int, generation: int, engines: Sequence[EngineSeen]) -> Suspect | None:
    """The member of `generation` that is not stuck while every other one is, and that was not heard
    from since they got stuck; None when there is none (or more than one member is not stuck)."""
    on = [e for e in engines if serves(e, generation) and e.dp_rank is not None]
    if size < 2 or len(on) != size:
        return None
    waiting = [e for e in on if e.stuck is not None and e.stuck.generation == generation]
    rest = [e for e in on if e not in waiting]
    if len(rest) != 1 or len(waiting) != size - 1:
        return None
    since = min(e.stuck.since for e in waiting if e.stuck is not None)
    heard = heard_at(rest[0].last_heartbeat_at, rest[0].shed_at)
    if heard is not None and heard >= since + timedelta(seconds=HEARTBEAT_LATENCY_S):
        return None  # a heartbeat it sent while they waited: it runs, slow, not frozen
    return Suspect(rest[0], tuple(waiting), since)


def frozen_member(size: int, generation: int, engines: Sequence[EngineSeen]) -> Suspect | None:
    """The suspect (`freeze_suspect`) once the evidence is whole: every member waiting on it named it
    silent to its own probe, and the coordinator's probe, started after they got stuck, got no answer."""
    suspect = freeze_suspect(size, generation, engines)
    if suspect is None:
        return None
    named = all(suspect.engine.id in (e.stuck.unanswered if e.stuck else ()) for e in suspect.waiting)
    probed = suspect.engine.probed
    silent = probed is not None and probed.started_at >= suspect.since and probed.reply is Reply.silent
    return suspect if named and silent else None
