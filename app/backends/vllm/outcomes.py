"""What each answer of vLLM's `POST /scale_elastic_ep` becomes on the job (pure).

| vLLM answer | job | error.type |
|---|---|---|
| 200 | verify, then `succeeded` | |
| 400 (invalid for this engine: its message) | `rolled_back` (nothing changed) | `invalid-for-engine` |
| 404 / 405 (no elastic EP route) | `rolled_back` | `scale-not-supported` |
| 408 (requests did not drain) | `failed` | `drain-timeout` |
| 409, or 503 "currently scaling" (someone else is scaling it) | `rolled_back` | `engine-busy` |
| 500 and anything else | `failed` | `engine-scale-failed` |
| no answer within the phase deadline | `failed` | `deadline-exceeded` |
| connection refused / reset | `failed` | `engine-unreachable` |

Where the engine may be left changed or stuck, the flow then checks it (`assess_after_failure`) and
marks the deployment `degraded` with a remediation when it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.backends.vllm.client import Answer, VllmCallError, VllmTimeout, VllmUnreachable
from app.jobs.states import JobState

WEDGE_HINT = (
    "if later scales are refused too, the engine may be stuck in its failed change (vLLM issue 53947): "
    "restart the vLLM server"
)


@dataclass(frozen=True)
class ScaleOutcome:
    state: JobState  # succeeded is decided after verification; failures end here
    type: str | None = None
    message: str | None = None
    http_status: int | None = None
    hint: str | None = None
    check_engine: bool = False  # the engine may be left stuck or changed: check it afterwards
    said: str | None = None  # vLLM's own message, as it gave it

    @property
    def accepted(self) -> bool:
        return self.state is JobState.succeeded


def outcome_of_answer(answer: Answer, *, target: int, drain_timeout_s: int) -> ScaleOutcome:
    outcome = _outcome_of_answer(answer, target=target, drain_timeout_s=drain_timeout_s)
    return replace(outcome, said=answer.message)


def _outcome_of_answer(answer: Answer, *, target: int, drain_timeout_s: int) -> ScaleOutcome:
    status, said = answer.status, answer.message
    if status == 200:
        return ScaleOutcome(JobState.succeeded, http_status=200, message=said)
    if status == 400:
        return ScaleOutcome(
            JobState.rolled_back,
            "invalid-for-engine",
            f"vLLM refused DP size {target} as invalid (400): {said}",
            400,
        )
    if status in (404, 405):
        return ScaleOutcome(
            JobState.rolled_back,
            "scale-not-supported",
            f"this vLLM server has no elastic EP endpoint ({status} on POST /scale_elastic_ep): {said}",
            status,
            "run a vLLM with elastic EP (--enable-elastic-ep --enable-expert-parallel, Ray DP backend)",
        )
    if status == 408:
        return ScaleOutcome(
            JobState.failed,
            "drain-timeout",
            f"vLLM gave up waiting for running requests to drain (408): {said}",
            408,
            f"raise the deployment's vllm.drain_timeout_s (now {drain_timeout_s} s) or scale when "
            "traffic is lower",
            check_engine=True,
        )
    if status == 409 or answer.scaling:
        return ScaleOutcome(
            JobState.rolled_back,
            "engine-busy",
            f"vLLM is already being scaled by someone else ({status}): {said}",
            status,
            "wait for the other change to end, then retry",
            check_engine=True,
        )
    return ScaleOutcome(
        JobState.failed,
        "engine-scale-failed",
        f"vLLM answered {status}: {said}",
        status,
        WEDGE_HINT,
        check_engine=True,
    )


def outcome_of_error(error: VllmCallError, *, deadline_s: float) -> ScaleOutcome:
    if isinstance(error, VllmTimeout):
        return ScaleOutcome(
            JobState.failed,
            "deadline-exceeded",
            f"vLLM did not answer POST /scale_elastic_ep within the phase deadline ({deadline_s:g} s)",
            hint="vLLM may still be scaling: the deployment is checked and marked degraded if so",
            check_engine=True,
        )
    if isinstance(error, VllmUnreachable):
        return ScaleOutcome(
            JobState.failed,
            "engine-unreachable",
            f"the scale call could not reach vLLM: {error.message}",
            check_engine=True,
        )
    return ScaleOutcome(JobState.failed, error.type, error.message, error.status, check_engine=True)
