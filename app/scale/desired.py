"""A deployment's standing intents -> the next job, level-triggered. HTTP-free.

`assess` reads what stands and what blocks, and applies the rule (`app.scale.stabilize`); `act` does
what the assessment says: marks intents found at their size, starts the job of a pending `/scale`
write, or the job the rule's move asks for, each intent acted on at most once. The intake of a request
(`app.scale.hooks.decide`) and the runner's `desired-size` task (`reconcile`) both go through them, so a
request deferred for an active job, the cooldown, the window or the pause is acted on later without a
repeat from the autoscaler.

Order of what holds a pending intent back: an active job, the cooldown (`autoscale_cooldown_s` from
the deployment's newest job of any source), a pending `/scale` write (acted on first), `paused`
(autoscaler intents only), then the rule (window, higher intent, max step).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import ConflictError, DomainError
from app.deployments.autoscaling import ScalingBehavior, ScalingRules
from app.deployments.models import Deployment, DesiredSize
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import create_reconfiguration
from app.jobs.states import JobState
from app.scale import intents, notes, retries, standing
from app.scale.blockers import Blocker, blocker
from app.scale.hooks.models import HookDecision
from app.scale.intents import SPEC_SOURCE, EndCode, IntentState, ScaleIntentRow
from app.scale.notes import note
from app.scale.stabilize import Ask, Moved, Verdict, decide

log = logging.getLogger(__name__)

SCALE_SUBRESOURCE = SPEC_SOURCE
_ACTED_ON = (HookDecision.accepted, HookDecision.ignored)  # records of these are act()'s to write
_NOT_MOVED = (JobState.cancelled.value, JobState.failed.value, JobState.rolled_back.value)


@dataclass(frozen=True)
class Outlook:
    """What happens to one pending intent now: the decision a record of it states."""

    decision: HookDecision
    code: str
    reason: str
    until: datetime | None = None


def behavior_of(deployment: Deployment) -> ScalingBehavior:
    return ScalingBehavior.stored(deployment.autoscale_behavior)


def _directions(behavior: ScalingBehavior) -> tuple[tuple[ScalingRules, bool], ...]:
    return ((behavior.scale_up, True), (behavior.scale_down, False))


def _moves(session: Session, deployment: Deployment, behavior: ScalingBehavior, now: datetime) -> list[Moved]:
    """Autoscaler jobs within the longer step period (what the max step counts)."""
    period = max(p.period_s for r, up in _directions(behavior) for p in r.effective_policies(up))
    jobs = session.exec(
        select(ReconfigurationJob).where(
            col(ReconfigurationJob.deployment_id) == deployment.id,
            col(ReconfigurationJob.requested_by) == RequestSource.autoscaler.value,
            col(ReconfigurationJob.created_at) > now - timedelta(seconds=period),
            col(ReconfigurationJob.state).not_in(_NOT_MOVED),
        )
    ).all()
    return [
        Moved(
            at=j.created_at,
            up=max(0, j.to_dp_size - j.from_dp_size),
            down=max(0, j.from_dp_size - j.to_dp_size),
        )
        for j in jobs
    ]


@dataclass
class Assessment:
    deployment: Deployment
    now: datetime
    rows: list[ScaleIntentRow]
    blocked: Blocker | None
    spec: ScaleIntentRow | None  # a pending /scale write: acted on before any autoscaler intent
    verdict: Verdict
    by_id: dict[str, ScaleIntentRow] = field(default_factory=dict)

    @property
    def pending(self) -> list[ScaleIntentRow]:
        return [r for r in self.rows if r.state == IntentState.pending.value]

    def outlook(self, intent: ScaleIntentRow) -> Outlook:
        """The decision about a pending intent, were nothing else to happen now."""
        size = intent.target_dp_size
        if intent.id in self.verdict.at_size:
            return Outlook(HookDecision.ignored, "already-at-size", f"already at DP size {size}")
        if self.blocked is not None:
            return Outlook(
                HookDecision.deferred,
                self.blocked.code,
                f"desired size {size} recorded; {self.blocked.reason}: the coordinator acts when that "
                "ends, no repeat needed",
                self.blocked.until,
            )
        if intent.source == SPEC_SOURCE:
            return Outlook(HookDecision.accepted, "scaling", f"scale subresource: {size}")
        if self.spec is not None:
            return Outlook(
                HookDecision.deferred,
                "scale-subresource",
                f"a /scale write (spec.replicas {self.spec.target_dp_size}) is acted on first",
            )
        if self.deployment.autoscale_paused:
            return Outlook(
                HookDecision.paused,
                "paused",
                f"desired size {size} recorded; autoscaling of {self.deployment.name} is paused "
                "(autoscale_paused): nothing moves until it is resumed",
            )
        move = self.verdict.move
        if move is not None and intent.id in move.serves:
            return Outlook(
                HookDecision.accepted,
                "scaling",
                f"scaling {self.deployment.current_dp_size} -> {move.to}: {move.note}",
            )
        hold = self.verdict.holds.get(intent.id)
        if hold is not None:
            return Outlook(
                HookDecision.held, hold.code, f"desired size {size} held: {hold.reason}", hold.until
            )
        return Outlook(HookDecision.deferred, "pending", f"desired size {size} pending")


def assess(session: Session, deployment: Deployment, now: datetime | None = None) -> Assessment:
    now = now or utc_now()
    behavior = behavior_of(deployment)
    lookback = max(behavior.scale_up.stabilization_window_s, behavior.scale_down.stabilization_window_s)
    rows = intents.recent(session, deployment.id, now - timedelta(seconds=lookback))
    autos = [r for r in rows if r.source != SPEC_SOURCE]
    specs = [r for r in rows if r.source == SPEC_SOURCE and r.state == IntentState.pending.value]
    blocked = blocker(session, deployment, now)
    asks = [
        Ask(
            r.id, r.target_dp_size, r.state == IntentState.pending.value, r.created_at, r.ended_at, r.retry_at
        )
        for r in autos
    ]
    verdict = decide(
        asks,
        current=deployment.current_dp_size,
        behavior=behavior,
        moves=_moves(session, deployment, behavior, now),
        now=now,
    )
    if blocked is not None and blocked.code == "active-job":
        verdict.at_size = []  # judged once the job has ended: the size is about to change
    return Assessment(
        deployment=deployment,
        now=now,
        rows=rows,
        blocked=blocked,
        spec=specs[-1] if specs else None,
        verdict=verdict,
        by_id={r.id: r for r in rows},
    )


def start_job(
    session: Session,
    deployment: Deployment,
    *,
    target: int,
    source: str,
    requester: str | None,
    reason: str,
    on_created: Callable[[Session, ReconfigurationJob], None] | None = None,
) -> ReconfigurationJob:
    """Create the job that moves the deployment to `target` (every rule of the API applies; raises its
    DomainError)."""
    requested_by = RequestSource.scale_subresource if source == SPEC_SOURCE else RequestSource.autoscaler
    outcome = create_reconfiguration(
        session,
        request=ReconfigurationCreate(
            deployment=deployment.name, target_dp_size=target, reason=reason[:1000]
        ),
        requested_by=requested_by,
        requester=requester,
        on_created=on_created,
    )
    return outcome.job


@dataclass
class Acted:
    job: ReconfigurationJob | None = None
    served: tuple[str, ...] = ()
    refused: str | None = None  # why the job was not created (its DomainError)


def act(
    session: Session,
    assessment: Assessment,
    *,
    own: str | None = None,
    on_created: Callable[[Session, ReconfigurationJob], None] | None = None,
) -> Acted:
    """Do what the assessment says, and commit (with what the caller added to the session). `own`:
    the intent of the request being decided (its record is the caller's to write; `on_created` runs
    in the job's transaction). Intents acted on get a record each. A refused job rolls the whole
    transaction back (the intents stay as they were; the caller's additions are gone)."""
    deployment, now = assessment.deployment, assessment.now
    for intent_id in assessment.verdict.at_size:
        intent = assessment.by_id[intent_id]
        intents.mark_acted(intent, job_id=None, now=now)
        session.add(intent)
        if intent_id != own:
            note(
                session,
                deployment,
                intent,
                HookDecision.ignored,
                "already-at-size",
                f"already at DP size {intent.target_dp_size}",
            )
    move = assessment.verdict.move
    if assessment.blocked is not None or (
        assessment.spec is None and (deployment.autoscale_paused or move is None)
    ):
        session.commit()
        return Acted()
    if assessment.spec is not None:
        spec = assessment.spec
        target, source, requester = spec.target_dp_size, SPEC_SOURCE, spec.requester
        serve: tuple[ScaleIntentRow, ...] = (spec,)
        reason = f"scale subresource: spec.replicas {target} (deferred write, intent {spec.id})"
    else:
        assert move is not None
        serve = tuple(assessment.by_id[i] for i in move.serves)
        first = serve[0]
        target, source, requester = move.to, first.source, first.requester
        reason = f"{first.reason or first.source} ({move.note}; intent {first.id})"

    stepping = assessment.spec is None and move is not None and move.step

    def created(session: Session, job: ReconfigurationJob) -> None:
        for intent in serve:
            if stepping:  # a rate policy's step: the intent stays pending for the next period's
                intents.mark_stepped(intent, job_id=job.id)
            else:
                intents.mark_acted(intent, job_id=job.id, now=now)
            session.add(intent)
            if intent.id != own and intent.source != SPEC_SOURCE:
                note(
                    session,
                    deployment,
                    intent,
                    HookDecision.accepted,
                    "stepping" if stepping else "scaling",
                    f"scaling {deployment.current_dp_size} -> {target}: {reason}",
                    job_id=job.id,
                )
        if on_created is not None:
            on_created(session, job)

    try:
        job = start_job(
            session,
            deployment,
            target=target,
            source=source,
            requester=requester,
            reason=reason,
            on_created=created,
        )
    except DomainError as exc:  # e.g. an unresolved cleanup failure, or another coordinator won
        session.rollback()
        log.info("intents of %s not acted on yet: %s", deployment.name, exc.detail)
        return Acted(refused=exc.detail)
    return Acted(job=job, served=tuple(i.id for i in serve))


def expire(session: Session, deployment: Deployment, *, ttl_s: float, now: datetime) -> int:
    """End autoscaler intents nobody repeated within `ttl_s`; a record for each pending one."""
    ended = intents.expire_unrepeated(
        session, deployment.id, older_than=now - timedelta(seconds=ttl_s), now=now
    )
    for intent in ended:
        if intent.source == SPEC_SOURCE:
            continue
        if intent.state == IntentState.withdrawn.value:
            note(
                session,
                deployment,
                intent,
                HookDecision.withdrawn,
                EndCode.expired.value,
                f"desired size {intent.target_dp_size} withdrawn: not repeated for {ttl_s:g} s",
            )
    if ended:
        session.commit()
    return len(ended)


def reconcile_one(
    session: Session, deployment: Deployment, now: datetime, *, ttl_s: float = 86400.0
) -> ReconfigurationJob | None:
    expire(session, deployment, ttl_s=ttl_s, now=now)
    if retries.retry_failed(session, deployment, now):
        session.commit()
    assessment = assess(session, deployment, now)
    if not assessment.pending:
        return None
    for intent in assessment.pending:  # every decision is a record, a change of what holds it too
        outlook = assessment.outlook(intent)
        if intent.source != SPEC_SOURCE and outlook.decision not in _ACTED_ON:
            notes.note_change(session, deployment, intent, outlook.decision, outlook.code, outlook.reason)
    return act(session, assessment).job


def reconcile(
    session: Session, now: datetime | None = None, *, ttl_s: float = 86400.0
) -> list[ReconfigurationJob]:
    """One pass over the deployments with standing intents: the jobs it started."""
    now = now or utc_now()
    ids = session.exec(
        select(ScaleIntentRow.deployment_id).where(col(ScaleIntentRow.state).in_(intents.STANDING)).distinct()
    ).all()
    started = []
    for deployment_id in sorted(ids):
        deployment = session.get(Deployment, deployment_id)
        if deployment is None:
            continue
        job = reconcile_one(session, deployment, now, ttl_s=ttl_s)
        if job is not None:
            log.info(
                "intents: %s %d -> %d (job %s)", deployment.name, job.from_dp_size, job.to_dp_size, job.id
            )
            started.append(job)
    return started


def desired_publics(session: Session, deployments: Sequence[Deployment]) -> dict[str, DesiredSize]:
    """`desired_public` of many deployments, by id: one query finds those where something stands (most
    have nothing), and only those are assessed."""
    now = utc_now()
    ids = [d.id for d in deployments]
    recent = intents.with_recent(session, ids, now)
    short = set(standing.candidates(session, ids))  # a partial grow's target stands (rare)
    return {
        d.id: desired_public(session, d, now, known_standing=True)
        if d.id in recent or d.id in short
        else DesiredSize()
        for d in deployments
    }


def desired_public(
    session: Session, deployment: Deployment, now: datetime | None = None, *, known_standing: bool = False
) -> DesiredSize:
    """What the intents ask for next, with a partial grow's standing target."""
    return standing.shown(session, deployment, _of_intents(session, deployment, now, known_standing))


def _of_intents(
    session: Session, deployment: Deployment, now: datetime | None, known_standing: bool
) -> DesiredSize:
    if not known_standing and not intents.recent(session, deployment.id, now or utc_now()):
        return DesiredSize()  # nothing stands (one query: most deployments, most of the time)
    assessment = assess(session, deployment, now)
    pending = assessment.pending
    standing = intents.summaries(assessment.rows)
    if not pending:
        return DesiredSize(standing=standing)
    verdict = assessment.verdict
    if assessment.spec is not None:
        nxt = assessment.spec
    elif verdict.move is not None:
        nxt = assessment.by_id[verdict.move.serves[0]]
    else:
        held = [r for r in pending if r.id in verdict.holds and verdict.holds[r.id].code != "higher-intent"]
        nxt = (held or sorted(pending, key=lambda r: r.target_dp_size, reverse=True))[0]
    outlook = assessment.outlook(nxt)
    size = verdict.move.to if verdict.move is not None and assessment.spec is None else nxt.target_dp_size
    return DesiredSize(
        dp_size=size,
        intent_id=nxt.id,
        source=nxt.source,
        requester=nxt.requester,
        reason=nxt.reason,
        requested_at=nxt.created_at,
        pending=True,
        blocked_by=None if outlook.decision is HookDecision.accepted else outlook.code,
        next_scale_at=outlook.until,
        standing=standing,
    )


def supersede(session: Session, deployment: Deployment, *, code: EndCode, by: str, now: datetime) -> None:
    """An operator's job or a `/scale` write: every intent older than it ends; a record for each pending
    one (it lost its desired size). The caller commits (with its job or write)."""
    for intent in intents.supersede_older(session, deployment.id, code=code, by=by, before=now):
        if intent.source == SPEC_SOURCE:
            continue
        what = "an operator's job" if code is EndCode.operator_job else "a /scale write"
        note(
            session,
            deployment,
            intent,
            HookDecision.superseded,
            code.value,
            f"desired size {intent.target_dp_size} superseded by {what} ({by})",
        )


def supersede_for_job(session: Session, job: ReconfigurationJob) -> None:
    """`on_created` of an operator's job: it supersedes every intent older than it."""
    deployment = session.get(Deployment, job.deployment_id)
    if deployment is not None:
        supersede(session, deployment, code=EndCode.operator_job, by=job.id, now=job.created_at)


def refuse_if_paused(session: Session, ref: str) -> None:
    """An autoscaler's own job (its token on `POST /v1/reconfigurations`) waits while paused."""
    deployment = session.exec(select(Deployment).where(col(Deployment.name) == ref)).first()
    if deployment is not None and deployment.autoscale_paused:
        raise ConflictError(
            f"autoscaling of deployment {deployment.name!r} is paused (autoscale_paused): autoscaler "
            "jobs wait until it is resumed; operators may still scale",
            code="autoscaling-paused",
            deployment=deployment.name,
        )
