"""The vLLM backend's writes: job transitions and events (through `app.jobs.states`, one transaction
each, with the deployment's changes in the same transaction) and the deployment's health record.

Database work runs in worker threads; the flow awaits it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlmodel import Session

from app.backends.base import FlowRecord
from app.core.clock import utc_now
from app.core.sealing import opened
from app.deployments.models import Deployment, DeploymentStatus, EngineBackend, LauncherKind, StatusDetail
from app.deployments.status import set_status
from app.jobs.models import ReconfigurationJob
from app.jobs.states import JobState
from app.jobs.transitions import append_event

RESTART_HINT = "restart the vLLM server"


@dataclass(frozen=True)
class Degradation:
    """Why a deployment is degraded, and the remediation."""

    reason: str
    message: str
    hint: str | None = None

    def as_error_hint(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


@dataclass
class VllmJob:
    """What the flow knows about its job and deployment."""

    job_id: str
    deployment_id: str
    deployment_name: str
    launcher: str
    state: JobState
    from_size: int
    to_size: int
    to_generation: int
    url: str | None
    api_key: str | None
    drain_timeout_s: int
    served_model_name: str | None
    metrics_dp_size: int | None  # the DP size vLLM's metrics were last built for (see discovery)
    progress_step: str | None = None
    progress_percent: float = 0.0

    @property
    def scale_up(self) -> bool:
        return self.to_size > self.from_size


def restart_hint(deployment_name: str, launcher: str) -> str:
    if launcher == LauncherKind.local:
        return (
            f"{RESTART_HINT}: POST /v1/deployments/{deployment_name}/engine/restart "
            f"(`epctl deployments restart-engine {deployment_name}`)"
        )
    return (
        f"{RESTART_HINT}, then POST /v1/deployments/{deployment_name}/engine/reconcile "
        f"(`epctl deployments reconcile-engine {deployment_name}`)"
    )


class Record(FlowRecord[VllmJob]):
    """The vLLM flow's writes. A refused move raises `JobCancelled` (a cancel that was answered 202 is
    honoured) or `JobMovedOn` (cancelled while pending, claimed by another coordinator)."""

    # --- reading ----------------------------------------------------------------------------------

    async def load(self, job_id: str) -> VllmJob:
        def read(session: Session) -> VllmJob:
            job = session.get(ReconfigurationJob, job_id, populate_existing=True)
            if job is None:
                raise LookupError(job_id)
            deployment = session.get(Deployment, job.deployment_id)
            assert deployment is not None
            config = deployment.backend_config or {}
            return VllmJob(
                job_id=job.id,
                deployment_id=deployment.id,
                deployment_name=deployment.name,
                launcher=deployment.launcher,
                state=JobState(job.state),
                from_size=job.from_dp_size,
                to_size=job.to_dp_size,
                to_generation=job.to_generation,
                url=config.get("url"),
                api_key=opened(deployment.backend_secret),
                drain_timeout_s=int(config.get("drain_timeout_s") or 120),
                served_model_name=config.get("served_model_name"),
                metrics_dp_size=config.get("metrics_dp_size"),
                progress_step=job.progress_step,
                progress_percent=job.progress_percent,
            )

        return await self.run_in_session(read)

    # --- writing ----------------------------------------------------------------------------------

    async def note(
        self,
        job: VllmJob,
        kind: str,
        message: str,
        *,
        data: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
    ) -> None:
        await self.run_in_session(
            lambda s: append_event(
                s, job_id=job.job_id, kind=kind, message=message, data=data, changes=changes
            )
        )

    async def progress(
        self, job: VllmJob, step: str, percent: float, *, data: Mapping[str, Any] | None = None
    ) -> None:
        """A progress event when the step changes (one event per step, not per poll)."""
        if step == job.progress_step:
            return
        job.progress_step, job.progress_percent = step, percent
        await self.note(
            job,
            "progress",
            step,
            data={"step": step, "percent": percent, **(data or {})},
            changes={"progress_step": step, "progress_percent": percent},
        )


# --- the deployment's record (in the caller's transaction) ---------------------------------------------


def set_degraded(session: Session, deployment_id: str, degradation: Degradation, job_id: str | None) -> None:
    deployment = session.get(Deployment, deployment_id)
    if deployment is None:
        return
    detail = StatusDetail(
        reason=degradation.reason,
        message=degradation.message,
        hint=degradation.hint,
        since=utc_now(),
        job_id=job_id,
    )
    set_status(session, deployment, DeploymentStatus.degraded, detail)


def serving_as_scaled(job: VllmJob) -> Callable[[Session], None]:
    """For a job's success (`also=`): the deployment serves at the job's target size and generation."""

    def apply(session: Session) -> None:
        set_serving(
            session,
            job.deployment_id,
            dp_size=job.to_size,
            generation=job.to_generation,
            metrics_dp_size=job.to_size if job.scale_up else None,
        )

    return apply


def set_serving(
    session: Session,
    deployment_id: str,
    *,
    dp_size: int | None = None,
    generation: int | None = None,
    metrics_dp_size: int | None = None,
    url: str | None = None,
) -> None:
    """The engine serves as recorded: ready, no status detail; optionally a new size/generation."""
    deployment = session.get(Deployment, deployment_id)
    if deployment is None or deployment.backend != EngineBackend.vllm:
        return
    set_status(session, deployment, DeploymentStatus.ready)
    if dp_size is not None:
        deployment.current_dp_size = dp_size
    if generation is not None:
        deployment.generation = generation
    config = dict(deployment.backend_config or {})
    if metrics_dp_size is not None:
        config["metrics_dp_size"] = metrics_dp_size
    if url is not None:
        config["url"] = url
    deployment.backend_config = config
    deployment.updated_at = utc_now()
    session.add(deployment)
