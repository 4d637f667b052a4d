"""Reconfiguration jobs: create (validated, idempotent), read, cancel; a deployment's active job. HTTP-free.
Listing: `app.jobs.listing`; deleting a deployment with its job history: `app.jobs.deletion`.

State changes after creation go through `app.jobs.transitions.transition` / `append_event` only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import ConflictError, InvalidRequestError
from app.core.ids import new_id
from app.deployments.coverage import domain_of, shrink_breaks_coverage
from app.deployments.engines.models import SERVING_STATES, Engine, refuses_key
from app.deployments.engines.service import available_engines
from app.deployments.models import Deployment, DeploymentStatus, EngineBackend, LauncherKind
from app.deployments.service import get_deployment
from app.jobs.active import active_job_id
from app.jobs.cleanup import check_no_unresolved_cleanup
from app.jobs.idempotency import IdempotencyKey, TakenOver, claim_key, complete_key, forget_key, request_hash
from app.jobs.models import (
    JOB_ID_PREFIX,
    JobDetail,
    JobEvent,
    JobEventPublic,
    JobPublic,
    ReconfigurationCreate,
    ReconfigurationJob,
    RequestSource,
)
from app.jobs.retire import current_members, validate_retire
from app.jobs.states import (
    CANCELLABLE_STATES,
    TERMINAL_STATES,
    JobNotFoundError,
    JobState,
    StaleTransitionError,
)
from app.jobs.transitions import append_event, transition
from engine_agent.protocol import CommitMode, Strategy


class ActiveJobConflictError(ConflictError):
    code = "active-job-exists"


@dataclass(frozen=True)
class CreateOutcome:
    job: ReconfigurationJob
    replayed: bool  # an Idempotency-Key retry answered with the job the first request created


@dataclass(frozen=True)
class CancelOutcome:
    job: ReconfigurationJob
    immediate: bool  # cancelled now (it was pending) rather than asked of the runner


# --- create ------------------------------------------------------------------------------------------


def create_reconfiguration(
    session: Session,
    *,
    request: ReconfigurationCreate,
    requested_by: RequestSource,
    requester: str | None = None,
    idempotency: IdempotencyKey | None = None,
    on_created: Callable[[Session, ReconfigurationJob], None] | None = None,
) -> CreateOutcome:
    """Validate and insert a pending job (with its first log row). With an Idempotency-Key: the same key
    and body return the first job (`replayed`), another body raises 422, a retry while the first
    request is in flight raises 409. Any refusal writes nothing. `on_created(session, job)` may add
    rows that must commit with the job (and only with it), such as the record of a hook's decision."""
    if idempotency is None:
        job = _create(session, request, requested_by, requester, None, None, on_created)
        return CreateOutcome(job, False)
    body_hash = request_hash(request, requested_by)
    try:
        record, replay = claim_key(
            session, idempotency.scope, idempotency.key, body_hash, idempotency.in_flight_timeout_s
        )
    except TakenOver as taken:
        record, replay = taken.record, None
    if replay is not None:
        return CreateOutcome(replay, True)
    assert record is not None and record.id is not None
    try:
        job = _create(session, request, requested_by, requester, idempotency.key, record.id, on_created)
    except BaseException:
        forget_key(session, record.id)
        raise
    return CreateOutcome(job, False)


def check_membership_known(session: Session, deployment: Deployment) -> None:
    """Fail closed: a job changes a serving group's membership only when the coordinator hears every
    member. One it cannot hear while its group steps (a lost control link) refuses the job, 409
    `membership-unknown`, until it is heard again or the request says `force: true`."""
    lost = session.exec(
        select(Engine).where(
            Engine.deployment_id == deployment.id,
            col(Engine.link_lost_at).is_not(None),
            col(Engine.state).in_(SERVING_STATES),  # one out of its group is no member to see
        )
    ).all()
    if lost:
        names = ", ".join(
            f"{e.id} (since {e.link_lost_at.isoformat() if e.link_lost_at else '?'})" for e in lost
        )
        raise ConflictError(
            f"deployment {deployment.name!r}: the coordinator cannot hear {names} while its group steps "
            "(a lost control link): it changes no membership it cannot see. Retry once it is heard again, "
            "or send force: true",
            code="membership-unknown",
            engine_ids=[e.id for e in lost],
        )


def check_coverage_kept(
    session: Session, deployment: Deployment, target: int, retire: Sequence[str] | None
) -> None:
    """A shrink that would leave an expert with a single replica, where every expert has two now, is
    refused (409 `coverage-would-break`) unless the request says `force: true`."""
    if deployment.backend != EngineBackend.reference or target >= deployment.current_dp_size:
        return
    members = current_members(session, deployment)
    leaving = set(retire) if retire else {m.id for m in members[target:]}
    config = deployment.engine_config
    why = shrink_breaks_coverage(
        deployment.coverage,
        num_logical=int(config.get("num_logical_experts", 1)),
        num_redundant=int(config.get("num_redundant_experts", 0)),
        target=target,
        survivor_domains=[domain_of(m.data_host, m.url) for m in members if m.id not in leaving],
    )
    if why is not None:
        raise ConflictError(
            f"shrinking {deployment.name!r} from {deployment.current_dp_size} to {target} would break its "
            f"coverage: {why}. Add redundant experts or keep the size, or send force: true",
            code="coverage-would-break",
            target_dp_size=target,
        )


def check_keys_accepted(session: Session, deployment: Deployment) -> None:
    """A job must reach every engine it may use: one that refuses the coordinator's agent key refuses
    the job, 409 `engine-refuses-agent-key`, until the key is rotated (which restarts it where its
    launcher can) or its operator restarts it with the current key."""
    refusing = [
        e
        for e in session.exec(
            select(Engine).where(
                Engine.deployment_id == deployment.id, col(Engine.key_refused_at).is_not(None)
            )
        ).all()
        if refuses_key(e)
    ]
    if refusing:
        raise ConflictError(
            f"deployment {deployment.name!r}: {', '.join(e.id for e in refusing)} refuse the coordinator's "
            f"agent key, so no job can reach them. Rotate the key (`epctl deployments agent-key "
            f"{deployment.name} --rotate`): engines of the local or Ray launcher are restarted with it, a "
            "static agent must be restarted by its operator",
            code="engine-refuses-agent-key",
            engine_ids=[e.id for e in refusing],
        )


def _create(
    session: Session,
    request: ReconfigurationCreate,
    requested_by: RequestSource,
    requester: str | None,
    idempotency_key: str | None,
    idempotency_record_id: int | None,
    on_created: Callable[[Session, ReconfigurationJob], None] | None = None,
) -> ReconfigurationJob:
    deployment = get_deployment(session, ref=request.deployment)
    if request.retire is not None:  # bad input first (422), before conflicts with the state (409)
        validate_retire(session, deployment, request.target_dp_size, request.retire)
    _validate_target(session, deployment, request.target_dp_size, partial=not request.all_or_nothing)
    if not request.force:
        check_membership_known(session, deployment)
        if requested_by != RequestSource.self_heal:  # a loss already broke it; healing re-covers
            check_coverage_kept(session, deployment, request.target_dp_size, request.retire)
    check_keys_accepted(session, deployment)
    check_no_unresolved_cleanup(session, deployment.id, deployment.name)
    warmup_requested = request.warmup_policy.value if request.warmup_policy else deployment.warmup_policy
    strategy = request.strategy or Strategy(deployment.strategy)
    commit = _commit_mode(request.commit, strategy)
    now = utc_now()
    job = ReconfigurationJob(
        id=new_id(JOB_ID_PREFIX),
        deployment_id=deployment.id,
        state=JobState.pending.value,
        from_dp_size=deployment.current_dp_size,
        to_dp_size=request.target_dp_size,
        from_generation=deployment.generation,
        to_generation=deployment.generation + 1,
        requested_by=requested_by.value,
        requester=requester,
        reason=request.reason,
        # `auto` is resolved by the runner once it knows the participants' platforms.
        warmup_policy=None if warmup_requested == "auto" else warmup_requested,
        warmup_policy_requested=warmup_requested,
        strategy=strategy.value,
        commit_mode=commit.value,
        max_downtime_ms=request.max_downtime_ms or deployment.max_downtime_ms,
        idempotency_key=idempotency_key,
        retire=list(request.retire) if request.retire is not None else None,
        force=request.force,
        all_or_nothing=request.all_or_nothing,
        last_event_seq=1,
        created_at=now,
        updated_at=now,
    )
    session.add(job)
    try:
        session.flush()  # the job row first: the event row references it
    except IntegrityError:
        _raise_active_job_conflict(session, deployment)
    session.add(
        JobEvent(
            job_id=job.id,
            seq=1,
            kind="created",
            to_state=JobState.pending.value,
            created_at=now,
            message=f"scale {deployment.name} {job.from_dp_size} -> {job.to_dp_size} "
            f"requested by {requested_by.value}" + (f" ({requester})" if requester else ""),
        )
    )
    if idempotency_record_id is not None:
        complete_key(session, idempotency_record_id, job.id, now)
    if on_created is not None:
        on_created(session, job)
    try:
        session.commit()
    except IntegrityError:
        _raise_active_job_conflict(session, deployment)
    return job


def _raise_active_job_conflict(session: Session, deployment: Deployment) -> NoReturn:
    """The database's one-active-job index refused our insert: another request or coordinator won."""
    session.rollback()
    active = active_job_id(session, deployment_id=deployment.id)
    if active is None:  # the job that won has already ended (or its insert rolled back): ask for a retry
        raise ConflictError(
            f"deployment {deployment.name!r} changed while this request was creating its job; retry",
            code="concurrent-change",
            deployment=deployment.name,
        ) from None
    raise ActiveJobConflictError(
        f"deployment {deployment.name!r} already has an active reconfiguration {active}",
        active_job_id=active,
        deployment=deployment.name,
    ) from None


def _commit_mode(requested: CommitMode | None, strategy: Strategy) -> CommitMode:
    """The job's commit: engine-agreed by default; the blocking strategy does prepare's work inside
    the pause, which only the coordinator's two-step commit drives."""
    if requested is None:
        return CommitMode.coordinator if strategy == Strategy.blocking else CommitMode.engines
    if requested == CommitMode.engines and strategy == Strategy.blocking:
        raise InvalidRequestError(
            "commit 'engines' needs the background strategy (blocking runs prepare inside the pause)",
            code="commit-mode-unsupported",
        )
    return requested


def out_of_range(deployment: Deployment, field: str, size: int) -> InvalidRequestError:
    """`target-out-of-range`: `field` asks for a DP size outside the deployment's limits."""
    return InvalidRequestError(
        f"{field} {size} is outside the limits of deployment {deployment.name!r}: "
        f"[{deployment.min_dp_size}, {deployment.max_dp_size}]",
        code="target-out-of-range",
        min_dp_size=deployment.min_dp_size,
        max_dp_size=deployment.max_dp_size,
    )


def _validate_target(session: Session, deployment: Deployment, target: int, *, partial: bool = False) -> None:
    if not deployment.min_dp_size <= target <= deployment.max_dp_size:
        raise out_of_range(deployment, "target_dp_size", target)
    if deployment.backend == EngineBackend.vllm and deployment.current_dp_size == 0:
        raise ConflictError(
            f"deployment {deployment.name!r}: the DP size of its vLLM server is not known yet; start it "
            f"(POST /v1/deployments/{deployment.name}/engine/restart) or reconcile it "
            f"(POST /v1/deployments/{deployment.name}/engine/reconcile)",
            code="engine-size-unknown",
        )
    # A degraded deployment may be re-formed at its size (its group broke: a new generation on the
    # engines there are, or fresh ones), by an operator or by self-healing.
    reformable = (
        deployment.status == DeploymentStatus.degraded.value and deployment.backend == EngineBackend.reference
    )
    if target == deployment.current_dp_size and not reformable:
        raise ConflictError(
            f"deployment {deployment.name!r} already runs at DP size {target}",
            code="already-at-target",
            current_dp_size=deployment.current_dp_size,
        )
    if deployment.launcher == LauncherKind.static and deployment.backend == EngineBackend.reference:
        known = len(available_engines(session, deployment_id=deployment.id))
        # A partial grow goes ahead where it reaches more than the current size (the rest stands).
        if target > known and not (partial and known > deployment.current_dp_size):
            raise ConflictError(
                f"deployment {deployment.name!r} uses static launch and knows {known} engine(s); "
                f"target_dp_size {target} needs {target}: register more engines first",
                code="not-enough-engines",
                known_engines=known,
            )


# --- read ---------------------------------------------------------------------------------------------


def get_job(session: Session, *, job_id: str) -> ReconfigurationJob:
    job = session.get(ReconfigurationJob, job_id, populate_existing=True)
    if job is None:
        raise JobNotFoundError(f"no reconfiguration {job_id!r}", job_id=job_id)
    return job


def _deployment_name(session: Session, job: ReconfigurationJob) -> str:
    deployment = session.get(Deployment, job.deployment_id)
    return deployment.name if deployment else ""


def job_public(session: Session, job: ReconfigurationJob) -> JobPublic:
    return JobPublic.of(job, deployment=_deployment_name(session, job))


def list_events(session: Session, *, job_id: str, after_seq: int = 0) -> list[JobEvent]:
    return list(
        session.exec(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.seq > after_seq)
            .order_by(col(JobEvent.seq))
        ).all()
    )


def job_detail(session: Session, *, job_id: str) -> JobDetail:
    job = get_job(session, job_id=job_id)
    events = [JobEventPublic.model_validate(e) for e in list_events(session, job_id=job_id)]
    return JobDetail.of(job, deployment=_deployment_name(session, job), events=events)


def active_job(session: Session, *, deployment_id: str) -> ReconfigurationJob | None:
    job_id = active_job_id(session, deployment_id=deployment_id)
    return None if job_id is None else get_job(session, job_id=job_id)


# --- cancel -------------------------------------------------------------------------------------------


def cancel_job(session: Session, *, job_id: str, requester: str | None = None) -> CancelOutcome:
    """Pending: cancelled at once. Preparing/syncing: `cancel_requested` is set and the runner rolls the job
    back and ends it `cancelled`; the record refuses to move a job into `committing` over a pending
    cancel, so an accepted cancel is always honoured. Committing or later (including a job that moved
    there while this request was decided): refused, 409 `not-cancellable` (commit cannot be undone
    halfway)."""
    who = f" by {requester}" if requester else ""
    for _ in range(3):  # the runner may move the job while we decide; re-read and decide again
        job = get_job(session, job_id=job_id)
        state = JobState(job.state)
        if state is JobState.cancelled:
            return CancelOutcome(job, True)
        if state is JobState.pending:
            try:
                job = transition(
                    session,
                    job_id=job_id,
                    from_state=state,
                    to_state=JobState.cancelled,
                    message=f"cancelled{who} before it started",
                )
                return CancelOutcome(job, True)
            except StaleTransitionError:
                continue
        if state in CANCELLABLE_STATES:
            if job.cancel_requested:
                return CancelOutcome(job, False)
            try:
                append_event(
                    session,
                    job_id=job_id,
                    kind="cancel_requested",
                    message=f"cancel requested{who}",
                    changes={"cancel_requested": True},
                    expected_states=[state],
                )
                return CancelOutcome(get_job(session, job_id=job_id), False)
            except ConflictError:
                continue
        reason = "it has finished" if state in TERMINAL_STATES else "commit has started"
        raise ConflictError(
            f"reconfiguration {job_id} is {state}: cannot cancel, {reason}",
            code="not-cancellable",
            job_id=job_id,
            state=state.value,
        )
    raise ConflictError(f"reconfiguration {job_id} keeps changing state; retry", code="not-cancellable")


def link_incident(session: Session, *, job_id: str, incident_id: str) -> None:
    """The job names the incident that hit its generation right after it ended (the incident names the
    job: `app.deployments.status.set_status`'s `hit_job_id`); in the caller's transaction."""
    job = session.get(ReconfigurationJob, job_id)
    if job is not None:
        job.incident_id = incident_id
        session.add(job)
