"""A vLLM job whose coordinator died, finished from what the vLLM server says.

- `preparing` / `syncing`: nothing was asked of vLLM -> `rolled_back`;
- `committing`: the scale call may have reached vLLM. Once it no longer says it is scaling: after a
  scale-up its metrics tell the size (the target: verify and succeed; the old size: `failed`, nothing
  changed); after a scale-down they cannot (see `discovery.py`): `failed`, deployment `degraded`
  until an operator reconciles it. Unreachable or still scaling: `failed`, `degraded`;
- `cleaning_up`: vLLM had answered 200: verify again -> `succeeded` or `failed`.

No canary figures: the probe died with the coordinator.
"""

from __future__ import annotations

import asyncio
import time

from sqlalchemy.engine import Engine as DbEngine

from app.backends.base import JobMovedOn
from app.backends.vllm.checks import POLL_S, EngineChecks, FlowFailure
from app.backends.vllm.client import VllmCallError, VllmClient
from app.backends.vllm.discovery import Observation, observe
from app.backends.vllm.flow import VllmFlow
from app.backends.vllm.record import (
    Degradation,
    VllmJob,
    restart_hint,
    serving_as_scaled,
)
from app.jobs.models import JobError
from app.jobs.states import JobState

S = JobState


def _restarted(phase: str, message: str) -> JobError:
    return JobError(phase=phase, engine_id=None, type="coordinator-restarted", message=message)


async def reconcile_vllm_job(db: DbEngine, job_id: str, *, owner: str) -> None:
    flow = VllmFlow(db, owner=owner)
    job = await flow.record.load(job_id)
    try:
        await _reconcile(flow, job)
    except JobMovedOn:
        return


async def _reconcile(flow: VllmFlow, job: VllmJob) -> None:
    phase = job.state.value
    if job.state in (S.preparing, S.syncing):
        message = f"the coordinator stopped while the job was {phase}; nothing had been sent to vLLM"
        await flow.record.move(
            job,
            S.rolled_back,
            message=message,
            changes={"error": _restarted(phase, message), "downtime_ms": 0.0},
        )
        return
    if job.state not in (S.committing, S.cleaning_up):
        return
    await flow.record.note(
        job, "recovery", f"reconciling with vLLM after a coordinator restart (job was {phase})"
    )
    hint = restart_hint(job.deployment_name, job.launcher)
    if not job.url:
        raise AssertionError("a committing vLLM job always has the server's url")
    async with VllmClient(job.url, api_key=job.api_key, timeout_s=flow.settings.call_timeout_s) as client:
        seen = await _settled(client, flow.settings.verify_deadline_s)
        if not seen.reachable or seen.scaling is not False or not seen.healthy:
            why = seen.error or ("still scaling" if seen.scaling else f"/health {seen.health_status}")
            stuck = Degradation(
                "engine-stuck-scaling" if seen.scaling else "engine-unreachable",
                f"after a coordinator restart vLLM is not serving: {why}",
                hint,
            )
            await flow.end(
                job, FlowFailure(S.failed, phase, "coordinator-restarted", stuck.message, degradation=stuck)
            )
            return
        if job.state is S.committing:
            if not job.scale_up or seen.metrics_engines is None:
                unknown = Degradation(
                    "dp-size-unknown",
                    "the coordinator stopped during the scale call and vLLM's metrics cannot show whether a "
                    "scale-down happened",
                    f"check the server, then POST /v1/deployments/{job.deployment_name}/engine/reconcile "
                    '(with {"dp_size": N})',
                )
                await flow.end(
                    job,
                    FlowFailure(
                        S.failed, phase, "coordinator-restarted", unknown.message, degradation=unknown
                    ),
                )
                return
            if seen.metrics_engines != job.to_size:
                message = (
                    f"the coordinator stopped during the scale call; vLLM still runs {seen.metrics_engines} "
                    f"engine(s), not {job.to_size}"
                )
                await flow.end(
                    job,
                    FlowFailure(S.failed, phase, "coordinator-restarted", message),
                    engine_checked=seen.metrics_engines == job.from_size,
                )
                return
            await flow.record.move(job, S.cleaning_up, message=f"vLLM runs {job.to_size} engines; verifying")
        try:
            models = await client.models()
            await flow.checks.verify(job, client, EngineChecks.canary_model(job, models))
        except VllmCallError as exc:
            await flow.end(job, FlowFailure(S.failed, phase, exc.type, exc.message, http_status=exc.status))
            return
        except FlowFailure as failure:
            await flow.end(job, failure)
            return

        await flow.record.move(
            job,
            S.succeeded,
            message=f"reconciled after a coordinator restart: vLLM serves at {job.to_size}",
            changes={"progress_step": "done", "progress_percent": 100.0},
            also=serving_as_scaled(job),
        )


async def _settled(client: VllmClient, deadline_s: float) -> Observation:
    """Observe until vLLM no longer says it is scaling (or the deadline)."""
    give_up = time.monotonic() + deadline_s
    while True:
        seen = await observe(client)
        if not seen.reachable or seen.scaling is False or time.monotonic() >= give_up:
            return seen
        await asyncio.sleep(POLL_S)
