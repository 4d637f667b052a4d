"""Self-healing's rule: at most one job per pass, by the deployment's `on_engine_loss` (pure).

- Warm spares (`spares`, issue 38): with either policy, the job after a loss forms the new generation on
  the survivors and as many warm spares as it has (idle engines that never served), back to the size it
  had; their rows are the lost ranks' (`resident.spare_filled`). The spare keeper launches new spares.
- `shrink`: once a member of the current generation is `unreachable`, it is written off (`left`; its
  launcher stops it, so a frozen engine can never come back into a group; the deployment keeps the
  names in `heal_lost`), and once no survivor is left on the broken generation (each leaves at once:
  the first to see the group break tells the others) a recovery job (source `self-heal`) scales the
  deployment to the survivors, which join the new generation as fresh engines.
- `replace`: the same, and the size it had is kept (`heal_target_dp_size`): once the shrink succeeded and
  the deployment is whole, a second job launches engines and grows it back (tried again until it has
  that size; dropped when an operator's job came since). With no survivor at all, one job launches
  fresh engines straight back to that size.
- `none`: only the status, event and webhook say so; the operator acts.

A group that broke while every engine still heartbeats leaves the deployment `degraded` with every engine
idle: a job re-forms the group on them at the same size (`replace` launches what is missing; `shrink`
takes the engines there are). With `shrink` and no engine left, nothing can be formed: the status says
so (`no-survivors`, announced once). A job that does not succeed is tried again after `retry_after_s`, at
most `max_attempts` times in a row; then self-healing stops (`self-heal-stopped`) until an operator's
job or the engines make the deployment whole again. Idle engines that cannot reach the others on the
data network are fenced (`reach`), not stopped: they come back once their network does. A fenced engine
silent for the grace, or an unreachable one off every generation, is written off and stopped.
"""

from __future__ import annotations

from datetime import datetime

from app.backends.reference.liveness import verdict as why
from app.backends.reference.liveness.board import Board
from app.backends.reference.liveness.health import (
    REASON_HEAL_STOPPED,
    REASON_MEMBERS_MISSING,
    REASON_NO_SURVIVORS,
    serves,
)
from app.backends.reference.liveness.reach import largest_reachable_set
from app.backends.reference.liveness.verdict import Fate, HealJob, NoJob
from app.backends.reference.liveness.view import EngineSeen
from app.deployments.engines.models import EngineState
from app.deployments.models import LauncherKind, OnEngineLoss
from app.jobs.models import RequestSource
from app.jobs.states import JobState

SELF_HEAL = RequestSource.self_heal.value


def heal(board: Board) -> None:
    policy = board.view.policy
    if policy is OnEngineLoss.none:
        board.action = NoJob(why.POLICY_NONE)
        return
    lost = [
        e
        for e in board.live()
        if e.state == EngineState.unreachable.value
        and e.generation == board.generation
        and e.dp_rank is not None
    ]
    if lost:
        board.take_out(lost, EngineState.left, Fate.written_off, None)
    given_up = [e for e in board.live() if _given_up(board, e)]
    if given_up:  # fenced and never came back (or unreachable off any generation): stop them
        for engine in given_up:
            board.set(engine, Fate.written_off, "not back within the grace", state=EngineState.left.value)
            board.released.add(engine.id)
        board.notes.append(f"wrote off {[e.id for e in given_up]} (not back)")
    still_on = [e for e in board.live() if serves(e, board.generation)]
    idle = [e for e in board.live() if e.state == EngineState.idle.value and not e.refuses_agent_key]
    if not still_on and idle:
        idle = _fence_the_cut_off(board, idle)
    if board.heal_lost and not still_on:
        _heal_loss(board, idle)  # every survivor left the broken group: a new generation on them
    elif not still_on and _broken_in_place(board, idle):
        # Every engine heartbeats, none serves: the group broke under them. Re-form it.
        if board.heal_loss_at is None:
            board.heal_loss_at = _degraded_since(board)
            board.memory_changed = True
        target = board.size if _can_launch(board) else len(idle)
        target = min(target, board.size)
        reason = f"self-heal: the group of generation {board.generation} broke; re-formed on {target}"
        _try(board, target, reason)
    elif (
        board.ready_and_clear()
        and board.health().whole
        and (board.heal_lost or board.heal_target is not None or board.heal_loss_at)
    ):
        board.forget_loss()  # healed (by us or by an operator's job)
        if any(e.state == EngineState.fenced.value for e in board.live()):
            # A fenced engine may come back (a freeze that ends): wait for it, up to the grace, before
            # launching a replacement; the deployment serves on the survivors meanwhile.
            board.action = NoJob(why.FENCED_MAY_RETURN)
            return
        _grow_back(board)
    elif still_on:
        board.action = NoJob(why.WHOLE if board.health().whole else why.WAITING)


def _given_up(board: Board, engine: EngineSeen) -> bool:
    if (
        engine.state not in (EngineState.fenced.value, EngineState.unreachable.value)
        or engine.dp_rank is not None
    ):
        return False
    # Silent that long: a fenced engine that heartbeats (its data link is cut) stays fenced.
    heard = engine.last_heartbeat_at or engine.updated_at or board.now
    return (board.now - heard).total_seconds() >= board.rules.fence_grace_s


def _fence_the_cut_off(board: Board, idle: list[EngineSeen]) -> list[EngineSeen]:
    """The idle engines a new generation can be formed on: the largest set that reaches one another on
    the data network; those outside are fenced (not stopped: they heartbeat over the control network)
    until their data network reaches their peers again."""
    last_members = {e.id for e in idle if e.broken_generation == board.generation}
    ranked = sorted(idle, key=lambda e: (e.id not in last_members, e.created_at or board.now, e.id))
    keep = set(largest_reachable_set([e.id for e in ranked], {e.id: e.data_unreachable for e in ranked}))
    cut_off = [e for e in ranked if e.id not in keep]
    if cut_off:
        board.take_out(
            cut_off, EngineState.fenced, Fate.cut_off, "its data network does not reach the others"
        )
    return [board.engines[e.id] for e in ranked if e.id in keep]


def _heal_loss(board: Board, idle: list[EngineSeen]) -> None:
    if idle:
        # The survivors (at least one: a deployment that lost its only engine takes an idle spare); a
        # deployment keeping warm spares takes them too, back to its size in this one job.
        spares = sum(1 for e in idle if is_spare(e)) if board.view.spares > 0 else 0
        target = max(1, min(len(idle), board.size - 1 + spares, board.size))
        _try(board, target, f"self-heal: lost {board.heal_lost}; a new generation on {target}")
    elif _can_launch(board):
        target = board.heal_target or board.size
        _try(board, target, f"self-heal: lost every engine ({board.heal_lost}); {target} fresh engines")
    else:
        _say(
            board,
            REASON_NO_SURVIVORS,
            f"every engine of generation {board.generation} was lost ({board.heal_lost}); "
            f"on_engine_loss {board.view.policy.value} has no survivor to form a new generation on",
            "scale the deployment (a job launches engines where the launcher can; with the static "
            "launcher, start and register engines first), or set on_engine_loss replace",
        )
        board.action = NoJob(why.NO_SURVIVORS)


def is_spare(engine: EngineSeen) -> bool:
    """A warm spare (`app.deployments.spares`): idle and never a member of a generation."""
    return engine.generation == 0 and engine.broken_generation is None and not engine.refuses_agent_key


def _try(board: Board, target: int, reason: str) -> None:
    """A recovery job to `target`, unless the last attempt just failed or too many did."""
    if target < 1:
        board.action = NoJob(why.NO_SURVIVORS)
        return
    failures = failures_in_a_row(board)
    if failures >= board.rules.max_attempts:
        _say(
            board,
            REASON_HEAL_STOPPED,
            f"{failures} self-heal jobs in a row did not succeed; self-healing stopped",
            "see the last self-heal job's error; an operator's job (or the engines serving again) "
            "resumes self-healing",
        )
        board.action = NoJob(why.HEAL_STOPPED)
        return
    if failures and _recently_ended(board):
        board.action = NoJob(why.RETRY_PAUSE)
        return
    board.action = HealJob(target, reason, board.heal_loss_at)


def _can_launch(board: Board) -> bool:
    return board.view.policy is OnEngineLoss.replace and board.view.launcher != LauncherKind.static.value


def _broken_in_place(board: Board, idle: list[EngineSeen]) -> bool:
    """Degraded (health confirmed it) with every engine heartbeating and idle: the group broke under
    engines that are all still there."""
    return (
        board.generation > 0
        and board.status == "degraded"
        and board.reason in (REASON_MEMBERS_MISSING, REASON_HEAL_STOPPED)
        and bool(idle)
        and not any(
            e.state in (EngineState.unreachable.value, EngineState.fenced.value) for e in board.live()
        )
    )


def _degraded_since(board: Board) -> datetime:
    since = (board.view.status_detail or {}).get("since")
    return datetime.fromisoformat(str(since)) if since else board.now


def failures_in_a_row(board: Board) -> int:
    """The newest jobs that are self-heal jobs that did not succeed, counted until any other (an
    operator's job, or a success, starts the count again)."""
    count = 0
    for job in board.view.newest_jobs[: board.rules.max_attempts]:
        if job.requested_by != SELF_HEAL or job.state == JobState.succeeded.value:
            break
        count += 1
    return count


def _recently_ended(board: Board) -> bool:
    newest = board.view.newest_jobs
    return bool(newest) and (board.now - newest[0].updated_at).total_seconds() < board.rules.retry_after_s


def _say(board: Board, reason: str, message: str, hint: str) -> None:
    """Why self-healing does nothing, in the status and one `deployment.degraded` event (once)."""
    if board.reason == reason:
        return
    board.write_status("degraded", reason, message, hint=hint, serving=0, announce_again=True)
    board.notes.append(message)


def _grow_back(board: Board) -> None:
    """`replace`: back to the size it had, tried again (as any self-heal job) until it is, unless an
    operator's job came since (their size wins) or too many attempts failed (it serves meanwhile)."""
    target = board.heal_target
    newest = board.view.newest_jobs[0] if board.view.newest_jobs else None
    operator_acted = newest is not None and newest.requested_by != SELF_HEAL
    exhausted = failures_in_a_row(board) >= board.rules.max_attempts
    if target is None or target <= board.size or operator_acted or exhausted:
        if exhausted and target is not None and target > board.size:
            board.notes.append(f"gave up growing back to {target} (self-heal jobs failed)")
        board.forget_loss(lost=False, target=True)
        board.action = NoJob(why.WHOLE)
        return
    if _recently_ended(board) and newest is not None and newest.state != JobState.succeeded.value:
        board.action = NoJob(why.RETRY_PAUSE)  # the last attempt just failed: wait before the next
        return
    reason = f"self-heal: replace the lost engines, back to {target}"
    board.action = HealJob(target, reason, board.heal_loss_at, detected=False)
