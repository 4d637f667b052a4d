"""One reconfiguration job on a vLLM deployment, start to end.

    pending -> preparing   preflight: reachable, healthy, not scaling, DP size as recorded, the API key
                           accepted, a canary completion answers
            -> syncing     baseline: canaries at a steady rate before anything changes (cancel works)
            -> committing  the blocking POST /scale_elastic_ep (phase deadline as its timeout) while
                           the canaries measure what clients see (vLLM's 503 window) and drive progress
            -> cleaning_up verify: not scaling, healthy, DP size as asked (where vLLM's metrics can
                           tell), a canary completion answers
            -> succeeded

Every answer of vLLM maps to an outcome (`outcomes.py`); after a failure that may have left the engine
stuck or changed, the engine is checked and the deployment marked `degraded` with a remediation.
The canary figures (the client outage, the slowest answer, canaries sent/failed, latencies per phase)
go on the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.backends.base import JobCancelled, JobMovedOn
from app.backends.vllm.canary import VllmCanary
from app.backends.vllm.checks import POLL_S, EngineChecks, FlowFailure
from app.backends.vllm.client import VllmCallError, VllmClient, VllmTimeout
from app.backends.vllm.outcomes import ScaleOutcome, outcome_of_answer, outcome_of_error
from app.backends.vllm.record import (
    Degradation,
    Record,
    VllmJob,
    restart_hint,
    serving_as_scaled,
    set_degraded,
    set_serving,
)
from app.backends.vllm.settings import VllmSettings, load_vllm_settings
from app.jobs.states import JobState
from app.probe import CanaryRecorder, ProbeFigures, figures_changes, outage_summary
from app.probe.figures import BASELINE

log = logging.getLogger(__name__)

S = JobState


@dataclass
class Scaled:
    """What the committing phase ended with."""

    outcome: ScaleOutcome
    failure: FlowFailure | None = None  # verification failed after a 200
    degradation: Degradation | None = None  # the engine checked after a failed call


def probe_changes(figures: ProbeFigures | None) -> dict[str, Any]:
    """The job columns the canary figures fill. vLLM reports no pause intervals of its own: its
    downtime is the window its middleware answers 503, which is what the canaries' outage measures."""
    if figures is None:
        return {}
    window = figures.outage_window
    return {
        **figures_changes(figures),
        "downtime_ms": figures.outage_ms,
        "downtime": {
            "source": "canary-probe",
            "downtime_ms": figures.outage_ms,
            "window_start": window[0] if window else None,
            "window_end": window[1] if window else None,
            "per_engine_ms": {},
        },
    }


class VllmFlow:
    def __init__(self, db: DbEngine, *, owner: str, settings: VllmSettings | None = None) -> None:
        self.record = Record(db)
        self.owner = owner
        self.settings = settings or load_vllm_settings()
        self.checks = EngineChecks(self.record, self.settings)

    # --- entry ------------------------------------------------------------------------------------

    async def run(self, job_id: str) -> None:
        job = await self.record.load(job_id)
        if job.state is not S.pending:
            return
        try:
            await self._run(job)
        except JobMovedOn as exc:
            log.info("job %s moved on without this coordinator: %s", job_id, exc)

    async def _run(self, job: VllmJob) -> None:
        if not await self.record.start(job, f"claimed by {self.owner}; vLLM at {job.url}"):
            return
        if not job.url:
            hint = restart_hint(job.deployment_name, job.launcher)
            await self.end(
                job,
                FlowFailure(
                    S.rolled_back,
                    "preparing",
                    "engine-not-started",
                    "the vLLM server of this deployment was never started",
                    hint=hint,
                ),
            )
            return
        settings = self.settings
        async with VllmClient(job.url, api_key=job.api_key, timeout_s=settings.call_timeout_s) as client:
            try:
                model = await asyncio.wait_for(
                    self.checks.preflight(job, client), settings.preflight_deadline_s
                )
            except TimeoutError:
                failure = FlowFailure(
                    S.rolled_back,
                    "preparing",
                    "deadline-exceeded",
                    f"preflight did not finish within {settings.preflight_deadline_s:g} s",
                )
                await self.end(job, failure)
                return
            except FlowFailure as failure:
                await self.end(job, failure)
                return
            canary = VllmCanary(model, api_key=job.api_key, prompt=settings.canary_prompt)
            try:
                await self._change(job, client, canary, model)
            finally:
                await canary.aclose()

    async def _change(self, job: VllmJob, client: VllmClient, canary: VllmCanary, model: str) -> None:
        settings = self.settings
        recorder = CanaryRecorder(
            canary,
            interval_s=settings.canary_interval_s,
            timeout_s=settings.canary_timeout_s,
            deadline_s=settings.canary_deadline_s,
        )
        cancelled = False
        scaled: Scaled | None = None
        async with recorder:
            recorder.set_targets([client.url])
            recorder.mark(BASELINE)
            await self.record.move(
                job, S.syncing, message=f"baseline: canaries for {settings.baseline_s:g} s"
            )
            await self.record.progress(job, "baseline", 25.0)
            try:
                await self.baseline(job)
                await self.record.move(
                    job,
                    S.committing,
                    message=f"POST /scale_elastic_ep new_data_parallel_size={job.to_size} "
                    f"drain_timeout={job.drain_timeout_s}",
                )
            except JobCancelled:
                cancelled = True
            if not cancelled:
                recorder.mark("committing")
                scaled = await self.scale(job, client, recorder, model)
        figures = recorder.figures()
        if cancelled:
            await self.record.move(
                job,
                S.cancelled,
                message="cancelled on request before the scale call was sent",
                changes={"error": JobCancelled("syncing").error, **probe_changes(figures)},
            )
            return
        assert scaled is not None
        await self.close(job, scaled, figures)

    # --- phases -----------------------------------------------------------------------------------

    async def baseline(self, job: VllmJob) -> None:
        """Canaries before anything changes; a cancel request ends the job here."""
        until = time.monotonic() + self.settings.baseline_s
        while True:
            if await self.record.cancel_requested(job):
                raise JobCancelled(job.state.value)
            left = until - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.2))

    async def scale(self, job: VllmJob, client: VllmClient, recorder: CanaryRecorder, model: str) -> Scaled:
        deadline_s = self.settings.scale_deadline_s
        await self.record.progress(job, "scaling:sent", 40.0)
        watcher = asyncio.create_task(self.follow_scaling(job, client, recorder))
        started = time.monotonic()
        try:
            answer = await asyncio.wait_for(
                client.scale(job.to_size, drain_timeout_s=job.drain_timeout_s, timeout_s=deadline_s),
                deadline_s + 1.0,
            )
        except TimeoutError:
            outcome = outcome_of_error(VllmTimeout("no answer"), deadline_s=deadline_s)
        except VllmCallError as exc:
            outcome = outcome_of_error(exc, deadline_s=deadline_s)
        else:
            outcome = outcome_of_answer(answer, target=job.to_size, drain_timeout_s=job.drain_timeout_s)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
        took_ms = round((time.monotonic() - started) * 1000.0, 1)
        await self.record.note(
            job,
            "engine",
            f"vLLM answered {outcome.http_status}: {outcome.said} ({took_ms} ms)"
            if outcome.http_status is not None
            else f"no answer from vLLM: {outcome.message} ({took_ms} ms)",
            data={"http_status": outcome.http_status, "message": outcome.said, "elapsed_ms": took_ms},
        )
        if outcome.accepted:
            answered_at = recorder.mark("verifying")
            await self.record.move(
                job, S.cleaning_up, message=f"vLLM answered 200 in {took_ms} ms; verifying"
            )
            try:
                await self.checks.verify(job, client, model)
            except FlowFailure as failure:
                return Scaled(outcome, failure=failure)
            # The canaries, too, see it serve again before the probe stops: the outage ends on an
            # answer, not on the stop, and the slowest answer includes one from after the change.
            await recorder.until_answered(answered_at, self.settings.canary_deadline_s + recorder.interval_s)
            return Scaled(outcome)
        recorder.mark("after")
        degradation = (
            await self.checks.assess_after_failure(job, client, outcome) if outcome.check_engine else None
        )
        return Scaled(outcome, degradation=degradation)

    async def follow_scaling(self, job: VllmJob, client: VllmClient, recorder: CanaryRecorder) -> None:
        """Progress while the call blocks: vLLM's scaling flag (or its 503s) and the canaries."""
        seen_down = False
        while True:
            await asyncio.sleep(POLL_S)
            live = recorder.live()
            try:
                scaling: bool | None = await client.is_scaling()
            except VllmCallError:
                scaling = None
            down = bool(scaling) or live.last_ok is False
            if down:
                seen_down = True
                await self.record.progress(
                    job,
                    "scaling:engine-scaling",
                    60.0,
                    data={
                        "is_scaling": scaling,
                        "canary_status": live.last_status,
                        "failing_for_ms": None
                        if live.failing_for_s is None
                        else round(live.failing_for_s * 1e3),
                    },
                )
            elif seen_down and live.last_ok:
                await self.record.progress(job, "scaling:engine-serving", 80.0)

    # --- the end ----------------------------------------------------------------------------------

    async def close(self, job: VllmJob, scaled: Scaled, figures: ProbeFigures) -> None:
        probe = probe_changes(figures)
        downtime = outage_summary(figures)
        if scaled.failure is not None:
            await self.end(job, scaled.failure, probe)
            return
        outcome = scaled.outcome
        if outcome.accepted:
            await self.record.move(
                job,
                S.succeeded,
                message=f"vLLM serves at DP size {job.to_size}; {downtime}",
                changes={"progress_step": "done", "progress_percent": 100.0, **probe},
                also=serving_as_scaled(job),
            )
            return
        failure = FlowFailure(
            outcome.state,
            "committing",
            outcome.type or "engine-scale-failed",
            outcome.message or "",
            http_status=outcome.http_status,
            hint=scaled.degradation.hint if scaled.degradation else outcome.hint,
            degradation=scaled.degradation,
        )
        await self.end(job, failure, probe, engine_checked=outcome.check_engine)

    async def end(
        self,
        job: VllmJob,
        failure: FlowFailure,
        probe: dict[str, Any] | None = None,
        *,
        engine_checked: bool = False,
    ) -> None:
        degradation = failure.degradation

        def health(session: Session) -> None:
            if degradation is not None:
                set_degraded(session, job.deployment_id, degradation, job.job_id)
            elif engine_checked:
                set_serving(session, job.deployment_id)  # checked and found serving: not wedged

        message = failure.error.message
        if degradation is not None:
            message += f"; deployment degraded ({degradation.reason})"
        changes: dict[str, Any] = {"error": failure.error, **(probe or {})}
        if "downtime_ms" not in changes and failure.state is S.rolled_back:
            changes["downtime_ms"] = 0.0
        await self.record.move(job, failure.state, message=message, changes=changes, also=health)
