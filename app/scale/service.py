"""Reading and setting a deployment's width in the `Scale` shape, HTTP-free.

A PUT goes through `app.jobs.service.create_reconfiguration`, the function behind
`POST /v1/reconfigurations`: the same limits, one active job per deployment (409 naming it), unresolved
cleanup refusal and Idempotency-Key handling; the job's source is `scale-subresource`.

Kubernetes semantics kept: `spec.replicas` is the desired size (a pending desired size, else an
active job's target, else the current size), `status.replicas` the observed one; a PUT of the size
already desired changes nothing (200, no job, unless its Idempotency-Key replays an earlier PUT); a PUT
carrying a `metadata.resourceVersion` other than the current one is a 409, as the Kubernetes API
server answers a stale update. The version is checked first: a retry should send either the version
it read or an Idempotency-Key, not both.

A PUT is an autoscaler request: it sets the deployment's desired size (`app.scale.desired`). While a
job is active or the cooldown runs, it is recorded and answered 200 without a job (annotation
`epctl.io/deferred` says why); the runner's reconciler starts the job when that ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import ConflictError, InvalidRequestError
from app.deployments.models import Deployment
from app.deployments.service import get_deployment
from app.jobs.idempotency import IdempotencyKey
from app.jobs.models import IdempotencyRecord, ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import active_job, create_reconfiguration, out_of_range
from app.scale import desired as desires
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


@dataclass(frozen=True)
class ScaleOutcome:
    scale: Scale
    job: ReconfigurationJob | None  # the job the PUT created (or replayed); None when nothing changed
    replayed: bool = False


def _resource_version(session: Session, deployment: Deployment) -> str:
    """Changes whenever spec or status can: a new generation or a new job of the deployment."""
    newest = session.exec(
        select(ReconfigurationJob.id)
        .where(ReconfigurationJob.deployment_id == deployment.id)
        .order_by(col(ReconfigurationJob.id).desc())
        .limit(1)
    ).first()
    return f"{deployment.generation}-{newest or 0}"


def _spec_replicas(session: Session, deployment: Deployment, active: ReconfigurationJob | None) -> int:
    """The size asked for last: a pending desire, else an active job's target, else the current size."""
    if desires.is_pending(session, deployment) and deployment.desired_dp_size is not None:
        return deployment.desired_dp_size
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
            resourceVersion=_resource_version(session, deployment),
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
    desired = scale.spec.replicas
    if desired is None:
        raise InvalidRequestError(
            "spec.replicas is required: the target DP size", code="scale-replicas-missing"
        )
    current = scale_of(session, deployment)
    sent_version = scale.metadata.resourceVersion
    if sent_version and sent_version != current.metadata.resourceVersion:
        raise ConflictError(
            f"the scale of deployment {deployment.name!r} has been modified (resourceVersion "
            f"{current.metadata.resourceVersion}, not {sent_version}); read it again and retry",
            code="scale-resource-version-conflict",
            resource_version=current.metadata.resourceVersion,
        )
    unchanged = desired == current.spec.replicas
    in_range = deployment.min_dp_size <= desired <= deployment.max_dp_size
    if unchanged and (idempotency is None or not in_range):
        return ScaleOutcome(scale=current, job=None)
    if not in_range:
        # Checked here too: 0 (scale to zero) is a valid Scale but never a valid DP size.
        raise out_of_range(deployment, "spec.replicas", desired)
    now = utc_now()
    blocked = desires.blocker(session, deployment, now)
    replay = idempotency is not None and _key_used(session, idempotency.scope, idempotency.key)
    if blocked is not None and not replay:
        desires.set_desired(
            deployment,
            size=desired,
            source=desires.SCALE_SUBRESOURCE,
            requester=requester,
            reason="scale subresource",
            now=now,
        )
        session.commit()
        return ScaleOutcome(scale=scale_of(session, deployment, deferred=blocked.reason), job=None)
    desires.set_desired(
        deployment,
        size=desired,
        source=desires.SCALE_SUBRESOURCE,
        requester=requester,
        reason="scale subresource",
        now=now,
    )
    try:
        outcome = create_reconfiguration(
            session,
            request=ReconfigurationCreate(
                deployment=deployment.name, target_dp_size=desired, reason="scale subresource"
            ),
            requested_by=RequestSource.scale_subresource,
            requester=requester,
            idempotency=idempotency,
        )
    except ConflictError:
        session.rollback()
        if not unchanged:
            raise
        # A keyed PUT of the size already desired that is not a replay: nothing to do, as without a key.
        return ScaleOutcome(scale=scale_of(session, deployment), job=None)
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
