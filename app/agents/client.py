"""The coordinator's client of one engine agent: one typed method per agent call (HTTP underneath:
`app.agents.transport`), each with a deadline, each counted in `epctl_agent_calls`. Failures raise the
typed errors of `app.agents.errors` (importable from here too).

Long operations answer 202 with the agent's `ReconfigStatus`: at once, or, given `wait_s`, once the
step's own phase is reached (one exchange per step). `watch` is one bounded long-poll of
`GET /v1/reconfig`; `wait_for_phase` repeats it until the agent's job is settled (`is_settled`, the one
rule for that). An agent that does not mark its answers with `LONG_POLL_HEADER` (one that cannot hold
an answer) is polled instead.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection, Sequence

from pydantic import BaseModel

from app.agents.errors import (
    AgentCallError,
    AgentDeadlineExceeded,
    AgentPhaseFailed,
    AgentProblem,
    AgentUnreachable,
)
from app.agents.transport import (
    DEFAULT_CALL_TIMEOUT_S,
    PATH_ABORT,
    PATH_AGENT_KEY,
    PATH_ARM,
    PATH_CLEANUP,
    PATH_CLEANUP_ACKNOWLEDGE,
    PATH_CLEANUP_RETRY,
    PATH_FAULTS,
    PATH_GENERATION_BROKEN,
    PATH_HEALTH,
    PATH_INFER,
    PATH_INFO,
    PATH_PAUSE,
    PATH_PREPARE,
    PATH_RECONFIG,
    PATH_RESUME,
    PATH_SPARE,
    PATH_SWITCH,
    PATH_SYNC,
    AgentAnswer,
    AgentSession,
    AgentTransport,
    encoded_body,
)
from engine_agent.protocol import (
    LONG_POLL_HEADER,
    MAX_WAIT_S,
    AgentInfo,
    AgentKeyRotated,
    AgentKeyRotation,
    ArmRequest,
    CleanupStatus,
    FaultInjection,
    GenerationBroken,
    InferRequest,
    InferResponse,
    JobRef,
    PauseRequest,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
    Settlement,
    SpareHeld,
    is_settled,
)


class AgentClient(AgentTransport):
    """Calls to one agent. Share one `AgentSession` among many of these for fan-out."""

    def __init__(
        self,
        engine_id: str,
        base_url: str,
        *,
        http: AgentSession | None = None,
        timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        token: str | None = None,
        keys: Sequence[str] = (),
    ) -> None:
        super().__init__(engine_id, base_url, http=http, timeout_s=timeout_s, token=token, keys=keys)
        # Whether the agent holds answers for `wait_s` (None: not known yet). Learnt from its answers.
        self.long_poll: bool | None = None
        # The agent's answer to the last reconfiguration step sent to it (a waiter can start from it).
        self.last_step_status: ReconfigStatus | None = None

    # --- reads -------------------------------------------------------------------------------------

    async def health(self, *, timeout_s: float | None = None) -> bool:
        await self._request("GET", PATH_HEALTH, timeout_s=timeout_s)
        return True

    async def info(self, *, timeout_s: float | None = None) -> AgentInfo:
        answer = await self._exchange("GET", PATH_INFO, timeout_s=timeout_s)
        return self._parse_answer(AgentInfo, answer, "info")

    async def hold_as_spare(self, *, timeout_s: float | None = None) -> SpareHeld:
        """Make an idle engine a warm spare: it loads every expert before it joins (issue 38)."""
        answer = await self._exchange("POST", PATH_SPARE, timeout_s=timeout_s)
        return self._parse_answer(SpareHeld, answer, "spare")

    async def rotate_key(self, key: str, overlap_s: float) -> AgentKeyRotated:
        """Push a rotated agent key (sent with the key current until now)."""
        AgentKeyRotation.model_validate({"key": key, "overlap_s": overlap_s})  # the agent's own bounds
        payload = json.dumps({"key": key, "overlap_s": overlap_s}).encode()
        answer = await self._exchange("POST", PATH_AGENT_KEY, body=payload)
        return self._parse_answer(AgentKeyRotated, answer, "agent-key")

    async def reconfig(self, *, timeout_s: float | None = None) -> ReconfigStatus | None:
        """The agent's current (or last) reconfiguration; None if it has never run one."""
        try:
            answer = await self._exchange("GET", PATH_RECONFIG, timeout_s=timeout_s)
        except AgentProblem as exc:
            if exc.status_code == 404:
                return None
            raise
        if not answer.content or answer.content == b"null":
            return None
        return self._parse_answer(ReconfigStatus, answer, "reconfig")

    async def cleanup_status(self, *, timeout_s: float | None = None) -> CleanupStatus:
        answer = await self._exchange("GET", PATH_CLEANUP, timeout_s=timeout_s)
        return self._parse_answer(CleanupStatus, answer, "cleanup")

    # --- reconfiguration steps (each answers 202 with the agent's status) -------------------------

    def _learn_long_poll(self, answer: AgentAnswer) -> None:
        self.long_poll = LONG_POLL_HEADER in answer.headers

    async def _step(
        self, path: str, payload: BaseModel, timeout_s: float | None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        """POST one step. With `wait_s` the agent answers once the step's phase is reached (or failed),
        at most `wait_s` (capped at `MAX_WAIT_S`) later; the call's deadline grows by that wait."""
        body = encoded_body(payload)
        wait = min(wait_s, MAX_WAIT_S) if self.long_poll is not False else 0.0
        if wait > 0:
            timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait
            try:
                answer = await self._exchange(
                    "POST", path, body=body, params={"wait_s": f"{wait:.3f}"}, timeout_s=timeout
                )
            except AgentProblem as exc:
                if exc.status_code not in (400, 422):
                    raise
                # An agent that refuses `wait_s` cannot hold answers: send the step plainly, and poll.
                answer = await self._exchange("POST", path, body=body, timeout_s=timeout_s)
                self.long_poll = False
            else:
                self._learn_long_poll(answer)
        else:
            answer = await self._exchange("POST", path, body=body, timeout_s=timeout_s)
        status = self._parse_answer(ReconfigStatus, answer, path)
        self.last_step_status = status
        return status

    async def prepare(
        self, request: PrepareRequest, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_PREPARE, request, timeout_s, wait_s)

    async def sync(
        self, job_id: str, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_SYNC, JobRef(job_id=job_id), timeout_s, wait_s)

    async def pause(
        self,
        job_id: str,
        *,
        lease_s: float | None = None,
        timeout_s: float | None = None,
        wait_s: float = 0.0,
    ) -> ReconfigStatus:
        return await self._step(PATH_PAUSE, PauseRequest(job_id=job_id, lease_s=lease_s), timeout_s, wait_s)

    async def switch(
        self, job_id: str, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_SWITCH, JobRef(job_id=job_id), timeout_s, wait_s)

    async def arm(
        self,
        job_id: str,
        *,
        deadline_s: float,
        lease_s: float | None = None,
        max_downtime_ms: int | None = None,
        timeout_s: float | None = None,
        wait_s: float = 0.0,
    ) -> ReconfigStatus:
        """The engine-agreed commit (`protocol.ArmRequest`); with `wait_s`, answered once committed."""
        request = ArmRequest(
            job_id=job_id, deadline_s=deadline_s, lease_s=lease_s, max_downtime_ms=max_downtime_ms
        )
        return await self._step(PATH_ARM, request, timeout_s, wait_s)

    async def resume(
        self, job_id: str, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_RESUME, JobRef(job_id=job_id), timeout_s, wait_s)

    async def abort(
        self, job_id: str, *, timeout_s: float | None = None, wait_s: float = 0.0
    ) -> ReconfigStatus:
        return await self._step(PATH_ABORT, JobRef(job_id=job_id), timeout_s, wait_s)

    async def watch(
        self,
        job_id: str,
        phases: Collection[ReconfigPhase],
        *,
        wait_s: float,
        timeout_s: float | None = None,
    ) -> ReconfigStatus | None:
        """One bounded long-poll: job `job_id`'s status once it is in one of `phases`, terminal or
        failed, or after `wait_s`. None while the agent has no such job (none, or another one).

        An agent known not to hold answers (`long_poll` False) is asked plainly (answers at once)."""
        wait = min(wait_s, MAX_WAIT_S)
        if self.long_poll is False or wait <= 0:
            status = await self.reconfig(timeout_s=timeout_s)
            return status if status is not None and status.job_id == job_id else None
        params = {"job_id": job_id, "wait_s": f"{wait:.3f}"}
        if phases:
            params["until"] = ",".join(sorted(p.value for p in phases))
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait
        try:
            answer = await self._exchange("GET", PATH_RECONFIG, params=params, timeout_s=timeout)
        except AgentProblem as exc:
            if exc.status_code in (404, 409):
                return None  # no job here, or another job
            if exc.status_code in (400, 422):
                self.long_poll = False
                return await self.watch(job_id, phases, wait_s=0.0, timeout_s=timeout_s)
            raise
        self._learn_long_poll(answer)
        status = self._parse_answer(ReconfigStatus, answer, "reconfig")
        return status if status.job_id == job_id else None

    async def cleanup_retry(self, *, timeout_s: float | None = None) -> CleanupStatus:
        body = await self._request("POST", PATH_CLEANUP_RETRY, timeout_s=timeout_s)
        return self._parse(CleanupStatus, body, "cleanup retry")

    async def cleanup_acknowledge(self, *, timeout_s: float | None = None) -> CleanupStatus:
        body = await self._request("POST", PATH_CLEANUP_ACKNOWLEDGE, timeout_s=timeout_s)
        return self._parse(CleanupStatus, body, "cleanup acknowledge")

    async def generation_broken(self, notice: GenerationBroken, *, timeout_s: float | None = None) -> bool:
        """Tell the agent to give up `notice.generation`'s group now; whether it served that one."""
        body = await self._request(
            "POST", PATH_GENERATION_BROKEN, body=notice.model_dump_json().encode(), timeout_s=timeout_s
        )
        return bool(body.get("abandoned")) if isinstance(body, dict) else False

    async def inject_faults(self, faults: FaultInjection, *, timeout_s: float | None = None) -> None:
        await self._request("POST", PATH_FAULTS, body=faults.model_dump_json().encode(), timeout_s=timeout_s)

    async def infer(self, tokens: list[list[float]], *, timeout_s: float | None = None) -> InferResponse:
        answer = await self._exchange(
            "POST",
            PATH_INFER,
            body=InferRequest(tokens=tokens).model_dump_json().encode(),
            timeout_s=timeout_s,
        )
        return self._parse_answer(InferResponse, answer, "infer")

    # --- polling ----------------------------------------------------------------------------------

    async def wait_for_phase(
        self,
        job_id: str,
        phases: Collection[ReconfigPhase],
        *,
        deadline_s: float,
        poll_interval_s: float = 0.05,
        on_status: Callable[[ReconfigStatus], None] | None = None,
    ) -> ReconfigStatus:
        """Long-poll (or, for an agent that cannot, poll) `GET /v1/reconfig` until the agent's
        reconfiguration `job_id` is settled against `phases` (`engine_agent.protocol.is_settled`).

        Raises `AgentPhaseFailed` when it failed instead (a terminal phase not asked for, or an
        error), `AgentDeadlineExceeded` after `deadline_s`. Transient poll failures are retried until
        the deadline; the last one is raised if the deadline passes while the agent is unreachable.
        """
        wanted = frozenset(phases)
        give_up_at = time.monotonic() + deadline_s
        last_error: AgentCallError | None = None
        while True:
            remaining = give_up_at - time.monotonic()
            if remaining <= 0:
                if last_error is not None and not isinstance(last_error, AgentDeadlineExceeded):
                    raise last_error
                raise AgentDeadlineExceeded(
                    self.engine_id,
                    f"job {job_id} did not reach {'/'.join(sorted(p.value for p in wanted))} "
                    f"within {deadline_s:.1f}s",
                )
            held = False  # the agent held this answer (a long-poll): no pause before the next one
            try:
                status = await self.watch(
                    job_id,
                    wanted,
                    wait_s=remaining,
                    timeout_s=min(self.timeout_s, max(remaining, 0.1)),
                )
                held = status is not None and bool(self.long_poll)
                last_error = None
            except (AgentUnreachable, AgentDeadlineExceeded) as exc:
                last_error = exc
                status = None
            if status is not None and on_status is not None and status.job_id == job_id:
                on_status(status)
            settlement = is_settled(status, job_id, wanted)
            if status is not None and settlement is Settlement.reached:
                return status
            if status is not None and settlement is Settlement.failed:
                raise AgentPhaseFailed(self.engine_id, status, wanted)
            if isinstance(last_error, AgentUnreachable) and time.monotonic() + poll_interval_s >= give_up_at:
                raise last_error
            if held:
                continue
            await asyncio.sleep(min(poll_interval_s, max(give_up_at - time.monotonic(), 0)))
