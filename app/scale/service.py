"""Reading and writing a deployment's width in the `Scale` shape, HTTP-free.

A write (PUT, or a PATCH turned into the object it makes: `app.scale.patches`) goes through
`app.jobs.service.create_reconfiguration`, the function behind `POST /v1/reconfigurations`: the same
limits, one active job per deployment, unresolved cleanup refusal and Idempotency-Key handling; the
job's source is `scale-subresource`.

Kubernetes semantics kept:
- `spec.replicas` is the size asked for last (a deferred write's, else an active job's target, else the
  current size), `status.replicas` the observed one; a write of the size already asked for changes
  nothing (200, no job, the same resourceVersion) unless its Idempotency-Key replays an earlier write.
- `metadata.resourceVersion` changes with every accepted write, deferred ones included, and whenever
  the status can (a new generation or a new job). A write carrying one other than the current is a 409
  (`scale-resource-version-conflict`), as the API server answers a stale update, and so is the loser of
  two writes sent with the same one: the version is claimed by a compare-and-set on the deployment row.
  The version is checked first: a retry should send either the version it read or an
  Idempotency-Key, not both.

A write is an operator's decision: it supersedes every autoscaler intent older than it, and neither the
stabilization rule nor `autoscale_paused` applies to it. While a job is active or the cooldown runs, it
is recorded (a pending intent of source `scale-subresource`) and answered 200 without a job
(annotation `epctl.io/deferred` says why); the runner's reconciler starts its job first when that ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import ConflictError, InvalidRequestError
from app.deployments.models import Deployment
from app.deployments.service import get_deployment
from app.jobs.idempotency import IdempotencyKey
from app.jobs.models import IdempotencyRecord, ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import active_job, create_reconfiguration, out_of_range
from app.scale import desired as desires
from app.scale import intents
from app.scale.blockers import blocker
from app.scale.intents import SPEC_SOURCE, EndCode, IntentState, ScaleIntentRow
from app.scale.models import (
    ACTIVE_JOB_ANNOTATION,
    DEFERRED_ANNOTATION,
    JOB_ANNOTATION,
    SELECTOR_LABEL,
    ObjectMeta,
    Scale,
    ScaleSpec,
    ScaleStatus,
)

SPEC_STREAM = intents.stream_key(SPEC_SOURCE)


@dataclass(frozen=True)
class ScaleOutcome:
    scale: Scale
    job: ReconfigurationJob | None  # the job the write created (or replayed); None when nothing changed
    replayed: bool = False


def resource_version(session: Session, deployment: Deployment) -> str:
    """`<generation>-<newest job>-<writes>`: changes whenever spec or status can."""
    newest = session.exec(
        select(ReconfigurationJob.id)
        .where(ReconfigurationJob.deployment_id == deployment.id)
        .order_by(col(ReconfigurationJob.id).desc())
        .limit(1)
    ).first()
    return f"{deployment.generation}-{newest or 0}-{deployment.scale_version}"


def _pending_write(session: Session, deployment: Deployment) -> ScaleIntentRow | None:
    return session.exec(
        select(ScaleIntentRow).where(
            col(ScaleIntentRow.deployment_id) == deployment.id,
            col(ScaleIntentRow.source) == SPEC_SOURCE,
            col(ScaleIntentRow.state) == IntentState.pending.value,
        )
    ).first()


def _spec_replicas(session: Session, deployment: Deployment, active: ReconfigurationJob | None) -> int:
    pending = _pending_write(session, deployment)
    if pending is not None:
        return pending.target_dp_size
    if active is not None:
        return active.to_dp_size
    return deployment.current_dp_size


def scale_of(
    session: Session,
    deployment: Deployment,
    *,
    job: ReconfigurationJob | None = None,
    deferred: str | None = None,
) -> Scale:
    active = active_job(session, deployment_id=deployment.id)
    annotations: dict[str, str] = {}
    if active is not None:
        annotations[ACTIVE_JOB_ANNOTATION] = active.id
    if job is not None:
        annotations[JOB_ANNOTATION] = job.id
    if deferred is not None:
        annotations[DEFERRED_ANNOTATION] = deferred
    return Scale(
        metadata=ObjectMeta(
            name=deployment.name,
            uid=deployment.id,
            resourceVersion=resource_version(session, deployment),
            creationTimestamp=deployment.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            annotations=annotations or None,
        ),
        spec=ScaleSpec(replicas=_spec_replicas(session, deployment, active)),
        status=ScaleStatus(
            replicas=deployment.current_dp_size, selector=f"{SELECTOR_LABEL}={deployment.name}"
        ),
    )


def get_scale(session: Session, *, ref: str) -> Scale:
    return scale_of(session, get_deployment(session, ref=ref))


class ScaleVersionConflict(ConflictError):
    code = "scale-resource-version-conflict"


def _conflict(deployment: Deployment, current: str, sent: str) -> ConflictError:
    return ScaleVersionConflict(
        f"the scale of deployment {deployment.name!r} has been modified (resourceVersion {current}, not "
        f"{sent}); read it again and retry",
        resource_version=current,
    )


def _claim_write(session: Session, deployment: Deployment, *, conditional: bool) -> bool:
    """Bump the write counter (in the caller's transaction); with `conditional`, only if nobody did
    since the version was read (compare-and-set: of two writes sent with one version, one wins)."""
    seen = deployment.scale_version
    statement = sa.update(Deployment).where(col(Deployment.id) == deployment.id)
    if conditional:
        statement = statement.where(col(Deployment.scale_version) == seen)
    claimed = session.execute(statement.values(scale_version=Deployment.scale_version + 1))
    return bool(claimed.rowcount == 1)  # type: ignore[attr-defined]


def put_scale(
    session: Session,
    *,
    ref: str,
    scale: Scale,
    requester: str | None,
    idempotency: IdempotencyKey | None = None,
) -> ScaleOutcome:
    deployment = get_deployment(session, ref=ref)
    if scale.metadata.name is not None and scale.metadata.name != deployment.name:
        raise InvalidRequestError(
            f"the name of the object ({scale.metadata.name}) does not match the name on the URL "
            f"({deployment.name})",
            code="scale-name-mismatch",
        )
    wanted = scale.spec.replicas
    if wanted is None:
        raise InvalidRequestError(
            "spec.replicas is required: the target DP size", code="scale-replicas-missing"
        )
    current = scale_of(session, deployment)
    version = current.metadata.resourceVersion or ""
    sent = scale.metadata.resourceVersion
    if sent and sent != version:
        raise _conflict(deployment, version, sent)
    unchanged = wanted == current.spec.replicas
    in_range = deployment.min_dp_size <= wanted <= deployment.max_dp_size
    if unchanged and (idempotency is None or not in_range):
        return ScaleOutcome(scale=current, job=None)
    if not in_range:
        # Checked here too: 0 (scale to zero) is a valid Scale but never a valid DP size.
        raise out_of_range(deployment, "spec.replicas", wanted)
    now = utc_now()
    replay = idempotency is not None and _key_used(session, idempotency.scope, idempotency.key)
    blocked = None if replay else blocker(session, deployment, now)

    def claim() -> None:
        if not _claim_write(session, deployment, conditional=bool(sent)):
            raise _conflict(deployment, "(changed)", sent or "")

    if blocked is not None:
        try:
            claim()
        except ScaleVersionConflict:
            session.rollback()
            raise _conflict(deployment, resource_version(session, deployment), sent or "") from None
        write = intents.new_intent(
            deployment_id=deployment.id,
            source=SPEC_SOURCE,
            stream=SPEC_STREAM,
            target=wanted,
            requested=wanted,
            step=None,
            anchor=None,
            requester=requester,
            reason="scale subresource",
            now=now,
        )
        desires.supersede(session, deployment, code=EndCode.scale_write, by=write.id, now=now)
        session.add(write)
        session.commit()
        session.refresh(deployment)
        return ScaleOutcome(scale=scale_of(session, deployment, deferred=blocked.reason), job=None)

    def claim_and_supersede(session: Session, job: ReconfigurationJob) -> None:
        # In the job's own transaction: the version, the job and the superseded intents commit together.
        claim()
        desires.supersede(session, deployment, code=EndCode.scale_write, by=job.id, now=now)

    try:
        outcome = create_reconfiguration(
            session,
            request=ReconfigurationCreate(
                deployment=deployment.name, target_dp_size=wanted, reason="scale subresource"
            ),
            requested_by=RequestSource.scale_subresource,
            requester=requester,
            idempotency=idempotency,
            on_created=None if replay else claim_and_supersede,
        )
    except ScaleVersionConflict:
        session.rollback()
        raise _conflict(deployment, resource_version(session, deployment), sent or "") from None
    except ConflictError:
        session.rollback()
        if not unchanged:
            raise
        # A keyed write of the size already asked for that is not a replay: nothing to do, as without a key.
        session.refresh(deployment)
        return ScaleOutcome(scale=scale_of(session, deployment), job=None)
    except BaseException:
        session.rollback()
        raise
    session.refresh(deployment)
    shown = scale_of(session, deployment, job=outcome.job)
    # The answer shows the request taken: spec is the job's target even when a replayed job has ended.
    shown.spec.replicas = outcome.job.to_dp_size
    return ScaleOutcome(scale=shown, job=outcome.job, replayed=outcome.replayed)


def _key_used(session: Session, scope: str, key: str) -> bool:
    """Whether this Idempotency-Key was sent before (a retry replays its job, never defers)."""
    found = session.exec(
        select(IdempotencyRecord.id).where(IdempotencyRecord.scope == scope, IdempotencyRecord.key == key)
    ).first()
    return found is not None
