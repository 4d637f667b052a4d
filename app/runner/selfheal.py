"""Self-healing: a deployment that lost a member engine, or whose group broke, forms a new generation by
itself.

Run by the runner's `heartbeats` task after the status follows the engines (`app.deployments.health`),
for every reference deployment no job runs, by its `on_engine_loss` setting:

- `shrink`: once a member of the current generation is `unreachable` (its heartbeats stopped), it is
  written off (`left`; a launcher that started it stops it, so a frozen engine can never come back into
  a group; the deployment keeps the names in `heal_lost`), and once no survivor is left on the broken
  generation (each leaves at once: the first to see the group break tells the others) a recovery job
  (source `self-heal`, the same record, events and webhooks as any job) scales the deployment to the
  survivors. The survivors' group broke with the lost engine, so they join the new generation as fresh
  engines: the plan places every expert on them and each recomputes the weights it does not hold from
  the checkpoint (the seed).
- `replace`: the same, and the size it had is kept (`heal_target_dp_size`): once the shrink succeeded
  and the deployment is whole, a second self-heal job launches engines and grows it back (tried again
  until it has that size; dropped when an operator's job came since). With no survivor at all, one
  job launches fresh engines straight back to that size.
- `none`: only the status, event and webhook say so; the operator acts.

A group that broke while every engine still heartbeats (a collective timed out, a peer stalled past the
serving deadline) leaves the deployment `degraded` with every engine idle: a recovery job re-forms the
group on them at the same size (`replace` launches what is missing; `shrink` takes the engines there
are). With `shrink` and no engine left, nothing can be formed: the status says so (`no-survivors`,
announced once) and no job is tried. A job that does not succeed is tried again after `RETRY_AFTER_S`,
at most `MAX_ATTEMPTS` times in a row; then self-healing stops (`self-heal-stopped`) until an operator's
job or the engines make the deployment whole again: no crash loop of recovery jobs.

A dead engine is found before its heartbeat timeout when it can be: once a deployment no job runs is not
whole (a member left its group: the group broke), each engine still recorded on its generation is
probed (`GET /healthz`); a refused connection (nothing listens there: the process is gone) marks it
`unreachable` at once. An engine that answers late (frozen, or a loaded host) is left to the heartbeat
timeout: only proof of death shortcuts it.

Each recovery job records `loss_at` (the lost engine's last heartbeat, or when the broken group was
found), `time_to_detect_ms` (loss to the job's creation) and `time_to_serving_ms` (loss to the job's
new generation serving: on the survivors, or back at full size), set by the job's flow at its switch.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import httpx
from sqlmodel import Session, col, select

from app.agents.transport import agent_ssl_context
from app.core.clock import utc_now
from app.core.errors import DomainError
from app.deployments.engines.models import Engine, EngineState
from app.deployments.engines.service import mark_unreachable
from app.deployments.health import (
    REASON_MEMBERS_MISSING,
    SERVING_STATES,
    announce_degraded,
    assess,
    deployments_without_a_job,
)
from app.deployments.incidents import service as incidents
from app.deployments.models import (
    Deployment,
    DeploymentStatus,
    EngineBackend,
    LauncherKind,
    OnEngineLoss,
    StatusDetail,
    effective_on_engine_loss,
)
from app.jobs.async_record import WorkerSessions
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import active_job_id, create_reconfiguration
from app.jobs.states import JobState
from app.launchers.base import EngineHandle, Launcher
from app.runner.reach import largest_reachable_set

log = logging.getLogger(__name__)

REQUESTER = "coordinator"
RETRY_AFTER_S = 10.0  # after a self-heal job that did not succeed, before the next attempt
MAX_ATTEMPTS = 3  # self-heal jobs in a row that did not succeed, before self-healing stops
REASON_NO_SURVIVORS = "no-survivors"
REASON_HEAL_STOPPED = "self-heal-stopped"
PROBE_TIMEOUT_S = 1.0  # a suspect's /healthz: only a refused connection counts, never a slow answer
FENCE_GRACE_S = 15.0  # a fenced engine not back within this is written off (the heartbeat timeout)


@dataclass
class Healing:
    """What one pass decided: jobs created, and the lost engines to stop (by launcher name)."""

    jobs: list[str] = field(default_factory=list)
    written_off: dict[str, list[EngineHandle]] = field(default_factory=dict)


def plan_healing(session: Session, *, fence_grace_s: float = FENCE_GRACE_S) -> Healing:
    """Write off lost engines and create the self-heal jobs due now (see the module doc); commits.
    A fenced engine not heard from within `fence_grace_s` of its fencing is written off for good."""
    healing = Healing()
    deployments = session.exec(
        select(Deployment).where(
            col(Deployment.backend) == EngineBackend.reference.value, col(Deployment.current_dp_size) > 0
        )
    ).all()
    for deployment in deployments:
        policy = effective_on_engine_loss(deployment.on_engine_loss, deployment.launcher)
        if policy is OnEngineLoss.none or active_job_id(session, deployment_id=deployment.id) is not None:
            continue
        engines = session.exec(
            select(Engine).where(
                Engine.deployment_id == deployment.id, Engine.state != EngineState.left.value
            )
        ).all()
        lost = [
            e
            for e in engines
            if e.state == EngineState.unreachable.value
            and e.generation == deployment.generation
            and e.dp_rank is not None
        ]
        if lost:
            _write_off(session, deployment, lost, policy, healing)
            engines = [e for e in engines if e not in lost]
        given_up = [
            e
            for e in engines
            if e.state in (EngineState.fenced.value, EngineState.unreachable.value)
            and e.dp_rank is None
            # Silent that long: a fenced engine that heartbeats (its data link is cut) stays fenced.
            and (utc_now() - (e.last_heartbeat_at or e.updated_at)).total_seconds() >= fence_grace_s
        ]
        if given_up:  # fenced and never came back (or unreachable off any generation): stop them
            for engine in given_up:
                healing.written_off.setdefault(engine.launched_by or deployment.launcher, []).append(
                    EngineHandle(engine_id=engine.id, url=engine.url, pid=engine.pid)
                )
                engine.state = EngineState.left.value
                session.add(engine)
            session.commit()
            log.warning("deployment %s: wrote off %s (not back)", deployment.name, [e.id for e in given_up])
            engines = [e for e in engines if e not in given_up]
        still_on_generation = [
            e for e in engines if e.generation == deployment.generation and e.state in SERVING_STATES
        ]
        idle = [e for e in engines if e.state == EngineState.idle.value]
        if not still_on_generation and idle:
            idle = _fence_the_cut_off(session, deployment, idle)
        if deployment.heal_lost and not still_on_generation:
            # Every survivor left the broken group: a new generation on them (or fresh engines).
            _heal_loss(session, deployment, policy, idle, healing)
        elif not still_on_generation and _broken_in_place(deployment, engines, idle):
            # Every engine heartbeats, none serves: the group broke under them. Re-form it.
            if deployment.heal_loss_at is None:
                deployment.heal_loss_at = _degraded_since(deployment)
            target = deployment.current_dp_size if _can_launch(deployment, policy) else len(idle)
            target = min(target, deployment.current_dp_size)
            generation = deployment.generation
            reason = f"self-heal: the group of generation {generation} broke; re-formed on {target}"
            _try(session, deployment, target, reason, healing)
        elif _whole(deployment, engines) and (
            deployment.heal_lost or deployment.heal_target_dp_size is not None or deployment.heal_loss_at
        ):
            deployment.heal_lost = None  # healed (by us or by an operator's job)
            if any(e.state == EngineState.fenced.value for e in engines):
                # A fenced engine may come back (a freeze that ends): wait for it, up to the grace,
                # before launching a replacement; the deployment serves on the survivors meanwhile.
                session.add(deployment)
                session.commit()
                continue
            _grow_back(session, deployment, healing)
    return healing


def _fence_the_cut_off(session: Session, deployment: Deployment, idle: list[Engine]) -> list[Engine]:
    """The idle engines a new generation can be formed on: the largest set that reaches one another on
    the data network (`app.runner.reach`); those outside are fenced (not stopped: they heartbeat over
    the control network) until their data network reaches their peers again."""
    ranked = sorted(idle, key=lambda e: (e.id not in _last_members(deployment, idle), e.created_at, e.id))
    keep = set(
        largest_reachable_set([e.id for e in ranked], {e.id: e.data_unreachable or [] for e in ranked})
    )
    cut_off = [e for e in ranked if e.id not in keep]
    if cut_off:
        fence(session, deployment, cut_off, why="its data network does not reach the others")
    return [e for e in ranked if e.id in keep]


def _last_members(deployment: Deployment, engines: Sequence[Engine]) -> set[str]:
    """The engines that reported the deployment's generation broken: its members until then."""
    return {e.id for e in engines if e.broken_generation == deployment.generation}


def _heal_loss(
    session: Session, deployment: Deployment, policy: OnEngineLoss, idle: Sequence[Engine], healing: Healing
) -> None:
    if idle:
        # The survivors (at least one: a deployment that lost its only engine takes an idle spare).
        target = max(1, min(len(idle), deployment.current_dp_size - 1))
        _try(session, deployment, target, _reason(deployment, target), healing)
    elif _can_launch(deployment, policy):
        target = deployment.heal_target_dp_size or deployment.current_dp_size
        reason = f"self-heal: lost every engine ({deployment.heal_lost}); {target} fresh engines"
        _try(session, deployment, target, reason, healing)
    else:
        _say(
            session,
            deployment,
            REASON_NO_SURVIVORS,
            f"every engine of generation {deployment.generation} was lost ({deployment.heal_lost}); "
            f"on_engine_loss {policy.value} has no survivor to form a new generation on",
            "scale the deployment (a job launches engines where the launcher can; with the static "
            "launcher, start and register engines first), or set on_engine_loss replace",
        )


def _try(session: Session, deployment: Deployment, target: int, reason: str, healing: Healing) -> None:
    """A recovery job to `target`, unless the last attempt just failed or too many did."""
    if target < 1:
        return
    failures = _failures_in_a_row(session, deployment)
    if failures >= MAX_ATTEMPTS:
        _say(
            session,
            deployment,
            REASON_HEAL_STOPPED,
            f"{failures} self-heal jobs in a row did not succeed; self-healing stopped",
            "see the last self-heal job's error; an operator's job (or the engines serving again) "
            "resumes self-healing",
        )
        return
    if failures and _recently_ended(session, deployment):
        return
    _request(session, deployment, target, reason, healing)


def _can_launch(deployment: Deployment, policy: OnEngineLoss) -> bool:
    return policy is OnEngineLoss.replace and deployment.launcher != LauncherKind.static.value


def _broken_in_place(deployment: Deployment, engines: Sequence[Engine], idle: Sequence[Engine]) -> bool:
    """Degraded (health confirmed it) with every engine heartbeating and idle: the group broke under
    engines that are all still there."""
    detail = deployment.status_detail or {}
    return (
        deployment.generation > 0
        and deployment.status == DeploymentStatus.degraded.value
        and detail.get("reason") in (REASON_MEMBERS_MISSING, REASON_HEAL_STOPPED)
        and bool(idle)
        and not any(e.state in (EngineState.unreachable.value, EngineState.fenced.value) for e in engines)
    )


def _degraded_since(deployment: Deployment) -> datetime:
    since = (deployment.status_detail or {}).get("since")
    return datetime.fromisoformat(str(since)) if since else utc_now()


def _whole(deployment: Deployment, engines: Sequence[Engine]) -> bool:
    """Its engines say so (`assess`), and the status agrees (the recovery was announced)."""
    ready = deployment.status == DeploymentStatus.ready.value and deployment.status_detail is None
    return ready and assess(deployment, engines).whole


def _reason(deployment: Deployment, target: int) -> str:
    return f"self-heal: lost {deployment.heal_lost}; a new generation on {target}"


def _newest_jobs(session: Session, deployment: Deployment, limit: int) -> Sequence[ReconfigurationJob]:
    return session.exec(
        select(ReconfigurationJob)
        .where(ReconfigurationJob.deployment_id == deployment.id)
        .order_by(col(ReconfigurationJob.created_at).desc())
        .limit(limit)
    ).all()


def _failures_in_a_row(session: Session, deployment: Deployment) -> int:
    """The deployment's newest jobs that are self-heal jobs that did not succeed, counted until any
    other (an operator's job, or a success, starts the count again)."""
    count = 0
    for job in _newest_jobs(session, deployment, MAX_ATTEMPTS):
        if job.requested_by != RequestSource.self_heal.value or job.state == JobState.succeeded.value:
            break
        count += 1
    return count


def _recently_ended(session: Session, deployment: Deployment) -> bool:
    last = _newest_jobs(session, deployment, 1)
    return bool(last) and (utc_now() - last[0].updated_at).total_seconds() < RETRY_AFTER_S


def _say(session: Session, deployment: Deployment, reason: str, message: str, hint: str) -> None:
    """Why self-healing does nothing, in the status and one `deployment.degraded` event (once)."""
    if (deployment.status_detail or {}).get("reason") == reason:
        return
    detail = StatusDetail(reason=reason, message=message, hint=hint, since=utc_now())
    announce_degraded(session, deployment, detail, serving=0)
    session.commit()
    log.warning("deployment %s: %s", deployment.name, message)


def _write_off(
    session: Session, deployment: Deployment, lost: Sequence[Engine], policy: OnEngineLoss, healing: Healing
) -> None:
    """Lost engines out of the deployment for good (`left`), to be stopped by their launcher."""
    for engine in lost:
        healing.written_off.setdefault(engine.launched_by or deployment.launcher, []).append(
            EngineHandle(engine_id=engine.id, url=engine.url, pid=engine.pid)
        )
    _take_out(session, deployment, lost, EngineState.left, policy, why=None)


def fence(session: Session, deployment: Deployment, stalled: Sequence[Engine], *, why: str) -> None:
    """Stalled engines out of the deployment's generation (`fenced`) but not stopped: one that comes back
    within the grace is re-admitted by the grow-back (see `app.runner.stalls`); commits."""
    policy = effective_on_engine_loss(deployment.on_engine_loss, deployment.launcher)
    _take_out(session, deployment, stalled, EngineState.fenced, policy, why=why)


def _take_out(
    session: Session,
    deployment: Deployment,
    engines: Sequence[Engine],
    state: EngineState,
    policy: OnEngineLoss,
    *,
    why: str | None,
) -> None:
    """The engines off the deployment's generation, the loss recorded for the self-heal jobs; commits."""
    now = utc_now()
    named = [
        f"{e.id} ({why})"
        if why
        else f"{e.id} (silent {(now - e.last_heartbeat_at).total_seconds():.1f} s)"
        if e.last_heartbeat_at
        else e.id
        for e in engines
    ]
    for engine in engines:
        engine.state = state.value
        engine.dp_rank = None
        engine.updated_at = now
        session.add(engine)
    newest = _newest_jobs(session, deployment, 1)
    if newest and newest[0].requested_by != RequestSource.self_heal.value:
        # An operator's job came after the last loss: its size is the one to return to, and what an
        # earlier heal left (its target, its loss) is over (a stale target larger than the idle engines
        # can fill would block the grow-back for good).
        deployment.heal_lost, deployment.heal_loss_at, deployment.heal_target_dp_size = None, None, None
    deployment.heal_lost = ", ".join(filter(None, [deployment.heal_lost, *named]))[:1000]
    # The loss happened after the last heartbeat heard from it: the earliest such, over the losses.
    heard = [e.last_heartbeat_at for e in engines if e.last_heartbeat_at is not None]
    deployment.heal_loss_at = min([*heard, *filter(None, [deployment.heal_loss_at])], default=now)
    incidents.note_lost(session, deployment, [e.id for e in engines], deployment.heal_loss_at)
    if policy is OnEngineLoss.replace:
        deployment.heal_target_dp_size = max(deployment.heal_target_dp_size or 0, deployment.current_dp_size)
    session.add(deployment)
    session.commit()
    verb = "fenced" if state is EngineState.fenced else "wrote off"
    log.warning("deployment %s: %s %s", deployment.name, verb, ", ".join(named))


def _grow_back(session: Session, deployment: Deployment, healing: Healing) -> None:
    """`replace`: back to the size it had, tried again (as any self-heal job) until it is, unless an
    operator's job came since (their size wins) or too many attempts failed (it serves meanwhile)."""
    target = deployment.heal_target_dp_size
    newest = _newest_jobs(session, deployment, 1)
    operator_acted = bool(newest) and newest[0].requested_by != RequestSource.self_heal.value
    exhausted = _failures_in_a_row(session, deployment) >= MAX_ATTEMPTS
    if target is None or target <= deployment.current_dp_size or operator_acted or exhausted:
        if exhausted and target is not None and target > deployment.current_dp_size:
            log.warning(
                "deployment %s: gave up growing back to %s (self-heal jobs failed)", deployment.name, target
            )
        deployment.heal_target_dp_size = None
        deployment.heal_loss_at = None
        session.add(deployment)
        session.commit()
        return
    session.add(deployment)
    session.commit()
    if _recently_ended(session, deployment) and newest[0].state != JobState.succeeded.value:
        return  # the last attempt just failed: wait before the next
    reason = f"self-heal: replace the lost engines, back to {target}"
    _request(session, deployment, target, reason, healing, detected=False)


def _request(
    session: Session,
    deployment: Deployment,
    target: int,
    reason: str,
    healing: Healing,
    *,
    loss_at: datetime | None = None,
    detected: bool = True,
) -> None:
    """Create the job; it records the loss it recovers from (`loss_at`, default the deployment's) and,
    for the first job after it (`detected`), the time to detect."""
    loss_at = loss_at or deployment.heal_loss_at
    name = deployment.name
    try:
        outcome = create_reconfiguration(
            session,
            request=ReconfigurationCreate(deployment=name, target_dp_size=target, reason=reason),
            requested_by=RequestSource.self_heal,
            requester=REQUESTER,
        )
    except DomainError as exc:  # out of limits, a cleanup failure to resolve, an operator's job first
        session.rollback()
        log.warning("deployment %s: no self-heal job to %s: %s", name, target, exc)
        return
    job = outcome.job
    if loss_at is not None:
        job.loss_at = loss_at
        if detected:
            job.time_to_detect_ms = round(max(0.0, (job.created_at - loss_at).total_seconds() * 1000.0), 1)
        session.add(job)
        session.commit()
    incidents.note_recovery_job(session, deployment.id, job.id)
    session.commit()
    healing.jobs.append(job.id)
    log.warning("deployment %s: self-heal job %s (%s)", name, job.id, reason)


def _suspects(session: Session) -> list[tuple[str, str]]:
    """(id, url) of the engines recorded on their deployment's generation, where it is not whole."""
    found: list[tuple[str, str]] = []
    for deployment, engines in deployments_without_a_job(session):
        if assess(deployment, engines).whole:
            continue
        found += [
            (e.id, e.url)
            for e in engines
            if e.generation == deployment.generation and e.state in SERVING_STATES
        ]
    return found


Probe = Callable[[str], Awaitable[bool]]  # an engine URL -> whether its process is gone


async def process_gone(url: str) -> bool:
    """True when nothing listens at `url` (connection refused); a slow or frozen engine is not gone."""
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, verify=agent_ssl_context()) as client:
        try:
            await client.get(f"{url.rstrip('/')}/healthz")
        except httpx.ConnectError as exc:
            # A TLS handshake that failed (a certificate not the operator's CA's) reached a listener.
            return not _tls_failure(exc)
        except httpx.HTTPError:
            return False  # the heartbeat timeout decides
    return False


def _tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def confirm_losses(
    record: WorkerSessions, probe: Probe = process_gone, *, follow: Callable[[Session], object] | None = None
) -> list[str]:
    """Mark `unreachable` now the suspects (see the module doc) whose process is gone; their ids.
    `follow` (the health pass) runs in the same transaction, so the status says why at once."""
    probed_at = utc_now()
    suspects = await record.run_in_session(_suspects)
    if not suspects:
        return []
    answers = await asyncio.gather(*(probe(url) for _, url in suspects))
    dead = [engine_id for (engine_id, _), gone in zip(suspects, answers, strict=True) if gone]
    if not dead:
        return []
    # A heartbeat that arrived since the probe began wins (the compare-and-set in mark_unreachable).
    marked = await record.run_in_session(
        lambda s: mark_unreachable(s, silent_since=probed_at, only=dead, follow=follow)
    )
    for engine in marked:
        log.warning(
            "engine %s of %s: gone (connection refused); marked unreachable", engine.id, engine.deployment
        )
    return [engine.id for engine in marked]


async def heal(
    record: WorkerSessions, launchers: Mapping[str, Launcher], *, fence_grace_s: float = FENCE_GRACE_S
) -> Healing:
    """One pass: create the jobs due, then stop the engines written off (a frozen one never returns)."""
    healing = await record.run_in_session(lambda s: plan_healing(s, fence_grace_s=fence_grace_s))
    for launcher_name, handles in healing.written_off.items():
        launcher = launchers.get(launcher_name)
        if launcher is None:
            continue
        try:
            await launcher.release_lost(handles)
        except Exception:
            log.exception("stopping lost engines %s failed", [h.engine_id for h in handles])
    return healing
