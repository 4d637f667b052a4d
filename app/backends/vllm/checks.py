"""The vLLM backend's looks at the engine around the scale call: preflight before it, verification
after a 200, and the check after a failure that decides whether the deployment is `degraded`.

Each raises `FlowFailure` (the job's end state and error, and the degradation if the engine is at
fault) or returns what the flow needs.
"""

from __future__ import annotations

import asyncio
import time

from app.backends.base import JobFailure
from app.backends.vllm.client import VllmAuthRejected, VllmCallError, VllmClient, VllmTimeout
from app.backends.vllm.discovery import Observation, observe
from app.backends.vllm.outcomes import ScaleOutcome
from app.backends.vllm.record import Degradation, Record, VllmJob, restart_hint
from app.backends.vllm.settings import VllmSettings
from app.jobs.models import JobError
from app.jobs.states import JobState

S = JobState
POLL_S = 0.25


class FlowFailure(JobFailure):
    """The vLLM flow's `JobFailure`: ends the job in `state` with this error (its HTTP status and hint
    kept, even when null); `degradation` marks the deployment degraded too."""

    def __init__(
        self,
        state: JobState,
        phase: str,
        type_: str,
        message: str,
        *,
        http_status: int | None = None,
        hint: str | None = None,
        degradation: Degradation | None = None,
    ) -> None:
        super().__init__(phase, type_, message)
        self.state = state
        self.degradation = degradation
        self.error = JobError(
            phase=phase,
            engine_id=None,
            type=type_,
            message=message,
            http_status=http_status,
            hint=hint or (degradation.hint if degradation else None),
        )


class EngineChecks:
    def __init__(self, record: Record, settings: VllmSettings) -> None:
        self.record = record
        self.settings = settings

    async def preflight(self, job: VllmJob, client: VllmClient) -> str:
        """Raises `FlowFailure` (rolled back: nothing was asked of vLLM); returns the canary's model."""
        await self.record.progress(job, "preflight", 5.0)
        hint = restart_hint(job.deployment_name, job.launcher)
        seen = await observe(client)
        if not seen.reachable:
            gone = Degradation(
                "engine-unreachable", f"vLLM at {client.url} is unreachable: {seen.error}", hint
            )
            raise FlowFailure(
                S.rolled_back, "preparing", "engine-unreachable", gone.message, degradation=gone
            )
        if seen.scaling:
            raise FlowFailure(
                S.rolled_back,
                "preparing",
                "engine-busy",
                "vLLM says it is already scaling: another change is in progress",
                hint="wait for it to end, then retry",
            )
        if not seen.healthy:
            sick = Degradation("engine-unhealthy", f"vLLM's /health answered {seen.health_status}", hint)
            raise FlowFailure(
                S.rolled_back,
                "preparing",
                "engine-unhealthy",
                sick.message,
                http_status=seen.health_status,
                degradation=sick,
            )
        self.check_size(job, seen, phase="preparing")
        try:
            models = await client.models()
        except VllmAuthRejected as exc:
            raise FlowFailure(
                S.rolled_back,
                "preparing",
                "engine-auth-rejected",
                exc.message,
                http_status=exc.status,
                hint=f"set the right key: PATCH /v1/deployments/{job.deployment_name} "
                '{"vllm": {"api_key": "..."}}',
            ) from exc
        except VllmCallError as exc:
            raise FlowFailure(
                S.rolled_back, "preparing", exc.type, exc.message, http_status=exc.status
            ) from exc
        model = self.canary_model(job, models)
        try:
            answer = await client.complete(model, self.settings.canary_prompt)
        except VllmCallError as exc:
            raise FlowFailure(
                S.rolled_back, "preparing", exc.type, f"a canary completion: {exc.message}"
            ) from exc
        if not answer.ok:
            raise FlowFailure(
                S.rolled_back,
                "preparing",
                "canary-failed",
                f"a canary completion of model {model!r} answered {answer.status}: {answer.message}",
                http_status=answer.status,
            )
        await self.record.note(
            job,
            "preflight",
            f"vLLM healthy, not scaling, DP size {job.from_size}; canary model {model!r}",
            data={"engine": seen.as_dict(), "model": model, "canary_ms": answer.elapsed_ms},
        )
        return model

    @staticmethod
    def canary_model(job: VllmJob, models: list[str]) -> str:
        """The deployment's `served_model_name`, else the first model the server lists."""
        return job.served_model_name or (models[0] if models else "")

    def check_size(self, job: VllmJob, seen: Observation, *, phase: str) -> None:
        """vLLM's metrics against the record (see `discovery.py` for what they can tell)."""
        if seen.metrics_engines is None or job.metrics_dp_size is None:
            return
        if seen.metrics_engines != job.metrics_dp_size:
            drift = Degradation(
                "dp-size-mismatch",
                f"vLLM's metrics show {seen.metrics_engines} engine(s) where epctl expects "
                f"{job.metrics_dp_size}: it was scaled or restarted outside epctl",
                f"POST /v1/deployments/{job.deployment_name}/engine/reconcile adopts the server's size",
            )
            state = S.rolled_back if phase == "preparing" else S.failed
            raise FlowFailure(state, phase, "dp-size-mismatch", drift.message, degradation=drift)

    async def verify(self, job: VllmJob, client: VllmClient, model: str) -> None:
        """After a 200: the engine serves at the new size, or `FlowFailure` (failed, degraded)."""
        await self.record.progress(job, "verifying", 90.0)
        hint = restart_hint(job.deployment_name, job.launcher)
        give_up = time.monotonic() + self.settings.verify_deadline_s
        while True:
            seen = await observe(client)
            if seen.reachable and seen.healthy and seen.scaling is False:
                break
            if time.monotonic() >= give_up:
                stuck = Degradation(
                    "engine-stuck-scaling",
                    f"vLLM answered 200 but is not serving {self.settings.verify_deadline_s:g} s "
                    f"later: {seen.as_dict()}",
                    hint,
                )
                raise FlowFailure(S.failed, "cleaning_up", "verify-failed", stuck.message, degradation=stuck)
            await asyncio.sleep(POLL_S)
        if job.scale_up and seen.metrics_engines is not None and seen.metrics_engines != job.to_size:
            drift = Degradation(
                "dp-size-mismatch",
                f"vLLM answered 200 but its metrics show {seen.metrics_engines} engine(s), not {job.to_size}",
                f"POST /v1/deployments/{job.deployment_name}/engine/reconcile adopts its size",
            )
            raise FlowFailure(S.failed, "cleaning_up", "dp-size-mismatch", drift.message, degradation=drift)
        how = (
            "its metrics show that many engines"
            if job.scale_up and seen.metrics_engines is not None
            else "taken from its 200 answer (vLLM rebuilds its per-engine metrics on scale-up only)"
        )
        try:
            answer = await client.complete(model, self.settings.canary_prompt)
        except VllmCallError as exc:
            gone = Degradation(exc.type, f"after the change a canary completion failed: {exc.message}", hint)
            raise FlowFailure(
                S.failed, "cleaning_up", "verify-failed", gone.message, degradation=gone
            ) from exc
        if not answer.ok:
            sick = Degradation(
                "engine-unhealthy",
                f"after the change a canary completion answered {answer.status}: {answer.message}",
                hint,
            )
            raise FlowFailure(S.failed, "cleaning_up", "verify-failed", sick.message, degradation=sick)
        await self.record.note(
            job,
            "verified",
            f"serving at DP size {job.to_size}: {how}",
            data={"engine": seen.as_dict(), "canary_ms": answer.elapsed_ms},
        )

    async def assess_after_failure(
        self, job: VllmJob, client: VllmClient, outcome: ScaleOutcome
    ) -> Degradation | None:
        """Is the engine left unreachable, still scaling, refusing scale requests, or at another size?"""
        hint = restart_hint(job.deployment_name, job.launcher)
        give_up = time.monotonic() + self.settings.settle_s
        while True:
            seen = await observe(client)
            if not seen.reachable:
                return Degradation(
                    "engine-unreachable", f"vLLM at {client.url} is unreachable: {seen.error}", hint
                )
            if seen.scaling is False:
                break
            if time.monotonic() >= give_up:
                return Degradation(
                    "engine-stuck-scaling",
                    f"vLLM still says it is scaling {self.settings.settle_s:g} s after the "
                    f"failed call ({outcome.type})",
                    hint,
                )
            await asyncio.sleep(POLL_S)
        try:
            self.check_size(job, seen, phase="committing")
        except FlowFailure as drift:
            return drift.degradation
        # Does it still accept a scale request? Only when its size is known to be the recorded one: a
        # scale to any other size would be a real change.
        if seen.metrics_engines is not None and seen.metrics_engines == job.from_size:
            verdict = await self.accepts_scaling(client, job)
            if verdict is not None:
                return Degradation("engine-refuses-scaling", verdict, hint)
        await self.record.note(
            job,
            "engine",
            "checked after the failure: reachable, not scaling, accepts scale requests",
            data={"engine": seen.as_dict()},
        )
        return None

    async def accepts_scaling(self, client: VllmClient, job: VllmJob) -> str | None:
        """A no-op scale to the current size (vLLM answers 200 without changing anything). None when
        accepted, else why not."""
        timeout = self.settings.accept_check_timeout_s
        try:
            answer = await asyncio.wait_for(
                client.scale(job.from_size, drain_timeout_s=job.drain_timeout_s, timeout_s=timeout),
                timeout + 1,
            )
        except (TimeoutError, VllmTimeout):
            return f"a no-op scale to its current size {job.from_size} got no answer within {timeout:g} s"
        except VllmCallError as exc:
            return f"a no-op scale to its current size failed: {exc.message}"
        if answer.ok:
            return None
        return (
            f"it refuses a no-op scale to its current size {job.from_size}: {answer.status} {answer.message}"
        )
