"""The judge: one deployment's verdict from one view and `now` (pure; every rule a row of
tests/runner/test_liveness_rules.py).

The rules run in this order over a working copy of the view (`Board`), each seeing what the earlier
ones decided:

1. `answers`  a starting coordinator asked every member (`adoption`): one that answers something else
              is recorded as it says, one where nothing listens is lost, one that does not answer is
              fenced, unless it is the only one and every other member serves with it (a lost link);
2. `gone`     an engine whose process is gone (connection refused, `probes`) is lost at once;
3. `frozen`   a member every other member waits on in a serving collective, that nobody (they, nor the
              coordinator's own probe) gets an answer from, and not heard from since, is fenced, and
              the others are told to leave its group now (`engines.frozen_member`, issue 39);
   `stalled`  a member every other member named when their group broke at the serving deadline, and
              not heard from since, is fenced on that evidence (`engines.stalled_members`);
4. `silence`  an engine silent past the heartbeat timeout is lost, unless its peers vouch for it (a lost
              control link) or the coordinator hears no engine at all (its own network is cut);
5. `health`   the deployment's status from its engines (`health.assess`), once it stayed so for the
              confirmation time (an unreachable member needs none: its timeout confirmed it);
6. `heal`     at most one self-heal job, by `on_engine_loss` (`heal`).

A deployment a job runs is the job's to judge: only `stalled` is (a member frozen inside the job, a commit
window's included, is fenced on the survivors' evidence rather than written off and stopped at its
heartbeat timeout while the job ends), silence (an engine marked lost, announced), and
`serving_in_a_job` (the deployment is never `ready` while fewer of its engines serve than it says:
`degraded members-missing` once that stayed so for the confirmation time); no job is asked
(`verdict.JOB_OWNS_IT`).

`judge_reported_break` is the status alone, for the heartbeat that first reports a member's group broken
(`reported`): written in that heartbeat's transaction, so no read sees the member out of its group while
the deployment says `ready` (issue 34); the pass it wakes judges the rest.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from app.backends.reference.liveness import engines as engine_rules
from app.backends.reference.liveness import heal as heal_rules
from app.backends.reference.liveness.board import Board
from app.backends.reference.liveness.health import (
    HEALTH_REASONS,
    REASON_MEMBERS_MISSING,
    REASON_STALLED,
    REASON_UNREACHABLE,
    assess,
    serves,
)
from app.backends.reference.liveness.verdict import EMPTY, JOB_OWNS_IT, Fate, Leave, NoJob, Verdict
from app.backends.reference.liveness.view import LIVE_STATES, Answer, DeploymentView, EngineSeen, Rules
from app.core.shedding import heard_at
from app.deployments.engines.models import SERVING_STATES, EngineState

REPORTED_BREAK = "a reported break: the status only (the pass it wakes judges the rest)"
JOB_HINT = (
    "the job ends at its deadlines (rolled back, or on without a leaver); self-healing re-forms the "
    "group on the engines that serve once it has ended"
)


def judge(view: DeploymentView, now: datetime, rules: Rules) -> Verdict:
    board = Board.of(view, now, rules)
    owned = view.active_job is not None
    if not owned and view.current_dp_size > 0:
        answers(board)
        gone(board)
        frozen(board)
    if view.current_dp_size > 0:
        stalled(board)  # in a job too: evidence, ahead of the silence that would write it off
    silence(board)
    if owned and view.current_dp_size > 0:
        serving_in_a_job(board)
    if owned:
        board.action = NoJob(f"{JOB_OWNS_IT} ({view.active_job.id})")  # type: ignore[union-attr]
    elif view.current_dp_size > 0:
        health(board)
        heal_rules.heal(board)
    else:
        board.action = NoJob(EMPTY)
    return board.verdict()


def judge_reported_break(view: DeploymentView, now: datetime, rules: Rules) -> Verdict:
    """The status a member's first report that its group broke leaves, at once (pure; the heartbeat's own
    transaction writes it, `act.write_reported_break`): `degraded members-missing` when fewer engines serve
    than the deployment says, counted as the pass counts (`serving_in_a_job` during a job, `health`
    outside one) but with no confirmation: a reported break of the recorded generation is no heartbeat
    racing a switch. Nothing else: fates, fences and heals are the pass's, which the report wakes. No
    change unless the deployment reads `ready` and a member of its generation reported it broke."""
    board = Board.of(view, now, rules)
    reported = any(e.broken_generation == view.generation for e in board.live())
    if view.current_dp_size > 0 and reported and board.status == "ready":
        if view.active_job is not None:
            serving_in_a_job(board)
        elif not (found := board.health()).whole:
            board.degrade_for_health(found)
    board.action = NoJob(REPORTED_BREAK)
    return replace(board.verdict(), broken_since=view.broken_since)


def deaf(view: DeploymentView, now: datetime, rules: Rules) -> bool:
    """The coordinator heard no engine at all for half the heartbeat timeout: its own network is cut
    (every host's heartbeats stop together), not every engine dead. Live agents beat several times per
    timeout, so some heartbeat is always fresher than that while it can hear anyone."""
    newest = view.hearing.newest_heartbeat_at
    return newest is not None and newest < now - timedelta(seconds=rules.heartbeat_timeout_s / 2)


def freeze_suspects(view: DeploymentView) -> list[EngineSeen]:
    """The engines the coordinator probes itself as freeze suspects (`engines.freeze_suspect`), in a
    deployment no job runs: at most one, and only while no probe of it started since its peers got
    stuck (the probe's reply is judged by `frozen`)."""
    if view.active_job is not None or view.current_dp_size < 2:
        return []
    suspect = engine_rules.freeze_suspect(view.current_dp_size, view.generation, view.engines)
    if suspect is None:
        return []
    probed = suspect.engine.probed
    return [] if probed is not None and probed.started_at >= suspect.since else [suspect.engine]


def probe_targets(view: DeploymentView) -> list[EngineSeen]:
    """The engines whose process is worth probing (`probes.process_gone`): those still recorded on the
    generation of a deployment no job runs that is not whole (a member left its group: it broke)."""
    if view.active_job is not None or view.current_dp_size == 0:
        return []
    if assess(view.current_dp_size, view.generation, view.engines).whole:
        return []
    return [e for e in view.engines if e.generation == view.generation and e.state in SERVING_STATES]


# --- the rules, in order ---------------------------------------------------------------------------------


def mark_lost(board: Board, engine: EngineSeen, why: str) -> None:
    """`unreachable`, announced; a member of the generation leaves a deployment no job runs degraded."""
    member = board.size > 0 and board.member(engine)
    board.set(engine, Fate.lost, why, state=EngineState.unreachable.value)
    board.announced.add(engine.id)
    if member:
        board.members_lost.add(engine.id)
    if member and board.view.active_job is None:
        message = f"{engine.id} (rank {engine.dp_rank} of generation {engine.generation}) went silent"
        board.write_status("degraded", REASON_UNREACHABLE, message)


def answers(board: Board) -> None:
    members = [e for e in board.live() if board.member(e) and e.asked is not None]
    if not members:
        return
    serving = [e for e in members if e.asked and e.asked.answer is Answer.serving]
    silent = [e for e in members if e.asked and e.asked.answer is Answer.silent]
    for engine in members:
        asked = engine.asked
        assert asked is not None
        if asked.answer is Answer.changed:
            board.set(
                engine,
                Fate.answered,
                f"answered {asked.state} on generation {asked.generation}",
                state=asked.state or engine.state,
                generation=asked.generation,
                dp_rank=asked.rank,
                world_size=asked.world_size,
                last_heartbeat_at=board.now,
            )
        elif asked.answer is Answer.gone:
            mark_lost(board, engine, "gone at the coordinator's start (connection refused)")
    if len(silent) == 1 and len(serving) == len(members) - 1:
        # It does not answer while every other member serves the generation with it: it steps with them
        # (a dead one would have broken their group), so the coordinator's link to it is lost, not the
        # engine (the heartbeat expiry judges it again later).
        (engine,) = silent
        board.set(
            engine,
            Fate.link_lost,
            "no answer at start, its group steps",
            link_lost_at=engine.last_heartbeat_at or board.now,
        )
    elif silent:
        board.take_out(
            silent, EngineState.fenced, Fate.silent_at_start, "did not answer the coordinator at its start"
        )


def gone(board: Board) -> None:
    for engine in board.live():
        if engine.process_gone and engine.state in LIVE_STATES:
            mark_lost(board, engine, "gone (connection refused)")


def frozen(board: Board) -> None:
    found = engine_rules.frozen_member(board.size, board.generation, board.live())
    if found is None:
        return
    engine = found.engine
    waited_s = (board.now - found.since).total_seconds()
    board.take_out(
        [engine], EngineState.fenced, Fate.frozen, "frozen: its peers wait on it, nobody gets an answer"
    )
    message = (
        f"{engine.id} stopped answering: every other member of generation {board.generation} has waited "
        f"on it in a serving collective for {waited_s:.1f} s, and neither they nor the coordinator get an "
        f"answer from it; fenced, the others leave its group and the generation re-forms without it"
    )
    hint = (
        "a frozen engine that comes back within the heartbeat timeout is re-admitted; one that does not "
        "is written off and stopped"
    )
    board.write_status("degraded", REASON_STALLED, message, hint=hint)
    board.leave = Leave(
        board.generation,
        tuple((e.id, e.url) for e in found.waiting),
        f"the coordinator fenced {engine.id}: frozen (its peers waited {waited_s:.1f} s on it)",
    )


def stalled(board: Board) -> None:
    found = engine_rules.stalled_members(board.size, board.generation, board.live())
    if not found:
        return
    names = ", ".join(engine.id for engine, _ in found)
    board.take_out(
        [engine for engine, _ in found], EngineState.fenced, Fate.stalled, "stalled: named by every survivor"
    )
    message = (
        f"{names} stopped answering: every other member of generation {board.generation} named "
        f"it when the group broke at the serving deadline; fenced, the generation re-forms without it"
    )
    hint = (
        "a frozen engine that comes back within the heartbeat timeout is re-admitted; one that does not "
        "is written off and stopped"
    )
    board.write_status("degraded", REASON_STALLED, message, hint=hint)


def silence(board: Board) -> None:
    """Engines silent past the heartbeat timeout (counted from this coordinator's start, and from the
    last moment it heard nobody: heartbeats come back one by one after a cut)."""
    now, hearing = board.now, board.view.hearing
    silent_since = now - timedelta(seconds=board.rules.heartbeat_timeout_s)
    if silent_since <= hearing.watching_since:
        return
    stale = [e for e in board.live() if e.state in LIVE_STATES and silent(e, silent_since)]
    if deaf(board.view, now, board.rules):
        # A deaf coordinator marks nothing lost (fail closed: it cannot see the membership): every silent
        # member of the generation gets the condition that refuses jobs.
        board.deaf = True
        for engine in stale:
            if engine.state in SERVING_STATES and board.member(engine) and engine.link_lost_at is None:
                lost_at = engine.last_heartbeat_at or now
                board.set(
                    engine, Fate.link_lost, "silent while the coordinator hears nobody", link_lost_at=lost_at
                )
        return
    if hearing.deaf_at is not None and silent_since <= hearing.deaf_at:
        return
    for engine in stale:
        if engine_rules.peers_vouch(board.size, board.generation, engine, board.live(), silent_since):
            if engine.link_lost_at is None:
                lost_at = engine.last_heartbeat_at or now
                board.set(engine, Fate.link_lost, "silent, but its group steps", link_lost_at=lost_at)
            continue
        mark_lost(board, board.engines[engine.id], "silent past the heartbeat timeout")


def silent(engine: EngineSeen, silent_since: datetime) -> bool:
    """Not heard since `silent_since`: neither a recorded heartbeat nor one this coordinator shed while
    saturated (`app.core.shedding`: its own overload never writes an engine off)."""
    heard = heard_at(engine.last_heartbeat_at, engine.shed_at)
    return engine.last_heartbeat_at is not None and heard is not None and heard < silent_since


def serving_in_a_job(board: Board) -> None:
    """While a job runs, the engines serving (or paused on) the recorded generation or the job's target
    must be at least min(recorded size, target size): a job's participant frozen in prepare past the
    serving collective's deadline took its group with it (the survivors left it), and the record said
    `ready` with none serving until the job ended (issue 34). Confirmed as `health` is (a heartbeat
    from either side of a switch must not flap it) unless a member reported that its group broke; the
    job's success writes `ready`, a rollback leaves it to `health`."""
    job = board.view.active_job
    assert job is not None
    generations = {board.generation, job.to_generation}
    serving = [
        e for e in board.live() if any(serves(e, g) for g in generations if g > 0) and e.dp_rank is not None
    ]
    need = min(board.size, job.to_dp_size) if job.to_dp_size > 0 else board.size
    if len(serving) >= need:
        board.broken_since = None
        return
    first_seen = board.broken_since = board.broken_since or board.now
    # A member that reported its group broke is no heartbeat racing a switch: no confirmation needed.
    reported = any(e.broken_generation == board.generation for e in board.live())
    confirmed = reported or (board.now - first_seen).total_seconds() >= board.rules.health_confirm_s
    if not confirmed or board.status == "degraded":
        return
    message = (
        f"{len(serving)} of {need} engines serve generation {board.generation}"
        f"{f' or {job.to_generation}' if job.to_generation != board.generation else ''} during job {job.id}"
    )
    board.write_status("degraded", REASON_MEMBERS_MISSING, message, hint=JOB_HINT, serving=len(serving))


def health(board: Board) -> None:
    found = board.health()
    if found.whole:
        board.broken_since = None
        if board.status != "ready" or board.detail is not None:
            board.write_status("ready", serving=found.serving)
        return
    if found.reason != REASON_UNREACHABLE and not board.view.at_start:
        # A heartbeat sent just before a switch and received just after it must not flap the status.
        first_seen = board.broken_since = board.broken_since or board.now
        if (board.now - first_seen).total_seconds() < board.rules.health_confirm_s:
            return
    if board.status == "degraded" and board.detail is not None:
        # Already degraded and announced. A detail health wrote itself is kept true as the engines
        # change, without a second event; another rule's reason is that rule's to change.
        if board.reason in HEALTH_REASONS:
            board.degrade_for_health(found)
        return
    board.degrade_for_health(found)


__all__ = ["deaf", "freeze_suspects", "judge", "judge_reported_break", "probe_targets", "serves"]
