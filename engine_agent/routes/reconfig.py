"""The reconfiguration: one POST per operation (`ACTIONS`: its body and executor call), and
`GET /v1/reconfig`, a bounded long-poll.

An action answers 202 with the job's status at once, or, given `wait_s`, once its end phase (the
protocol's `MOVES`, or one of `until`) is reached, the job is terminal or reports an error
(`protocol.is_settled`), at most `wait_s` later (capped at `MAX_WAIT_S`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from engine_agent.problems import ProblemError, problem_responses
from engine_agent.protocol import (
    LONG_POLL_HEADER,
    MAX_WAIT_S,
    MOVES,
    ArmRequest,
    JobRef,
    Operation,
    PauseRequest,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
    Settlement,
    is_settled,
)
from engine_agent.reconfig import ReconfigExecutor
from engine_agent.routes.deps import PROBLEM_RESPONSES, AgentDep

router = APIRouter(tags=["reconfig"])

WaitS = Annotated[
    float,
    Query(
        ge=0,
        description="hold the answer until the phase is reached, at most this long "
        f"(capped at {MAX_WAIT_S:g} s); 0 answers at once",
    ),
]
Until = Annotated[
    str | None,
    Query(description="comma-separated phases to wait for (terminal phases and errors always end the wait)"),
]

LONG_POLL_HEADERS = {LONG_POLL_HEADER: f"{MAX_WAIT_S:g}"}
RECONFIG_RESPONSES = {202: {"model": ReconfigStatus}, **PROBLEM_RESPONSES}


def _parse_until(until: str | None, default: frozenset[ReconfigPhase]) -> frozenset[ReconfigPhase]:
    if not until:
        return default
    phases: set[ReconfigPhase] = set()
    for name in until.split(","):
        name = name.strip()
        if not name:
            continue
        try:
            phases.add(ReconfigPhase(name))
        except ValueError:
            known = ", ".join(p.value for p in ReconfigPhase)
            raise ProblemError(
                422, "invalid-request", f"until: unknown phase {name!r} (one of {known})"
            ) from None
    return frozenset(phases) or default


def _settled(status: ReconfigStatus, until: frozenset[ReconfigPhase]) -> bool:
    return is_settled(status, status.job_id, until) != Settlement.pending


def _status_of(executor: ReconfigExecutor, job_id: str) -> ReconfigStatus:
    status = executor.status()
    if status is None:
        raise ProblemError(404, "no-job", "no reconfiguration has run on this agent")
    if status.job_id != job_id:
        raise ProblemError(
            409,
            "wrong-job",
            f"job {job_id} is not the job here ({status.job_id})",
            current_job_id=status.job_id,
        )
    return status


async def _wait_until(
    executor: ReconfigExecutor,
    job_id: str,
    until: frozenset[ReconfigPhase],
    wait_s: float,
    *,
    started: ReconfigStatus | None = None,
) -> ReconfigStatus:
    """Job `job_id`'s status once settled or after `wait_s`. The executor's threads wake this
    coroutine through the event loop; nothing blocks the loop meanwhile. With `started` (an action's
    own answer), a job that vanished meanwhile answers that instead of an error."""
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def wake() -> None:
        loop.call_soon_threadsafe(changed.set)

    executor.add_watcher(wake)
    try:
        give_up = loop.time() + min(wait_s, MAX_WAIT_S)
        while True:
            changed.clear()  # before reading: a change after the read sets it again
            if started is None:
                status = _status_of(executor, job_id)
            else:
                current = executor.status()
                status = current if current is not None and current.job_id == job_id else started
            remaining = give_up - loop.time()
            if _settled(status, until) or remaining <= 0:
                return status
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)
    finally:
        executor.remove_watcher(wake)


@dataclass(frozen=True)
class Action:
    """How one operation's POST reaches the executor."""

    body: type[BaseModel]
    call: Callable[[ReconfigExecutor, Any], ReconfigStatus]
    # The call only touches the executor's own state (briefly, under its lock) and runs on the event
    # loop, saving a thread hop inside the commit window; otherwise it may call into the engine and
    # runs in the thread pool.
    inline: bool
    doc: str | None = None


ACTIONS: dict[Operation, Action] = {
    Operation.prepare: Action(PrepareRequest, lambda executor, body: executor.prepare(body), inline=False),
    Operation.sync: Action(JobRef, lambda executor, body: executor.sync(body.job_id), inline=True),
    Operation.pause: Action(
        PauseRequest, lambda executor, body: executor.pause(body.job_id, body.lease_s), inline=True
    ),
    Operation.switch: Action(JobRef, lambda executor, body: executor.switch(body.job_id), inline=True),
    Operation.arm: Action(
        ArmRequest,
        lambda executor, body: executor.arm(body.job_id, body.deadline_s, body.lease_s, body.max_downtime_ms),
        inline=True,
        doc="""The engine-agreed commit: arm for the new generation; the engines pause, switch and resume
        at the first step boundary at which all of them are armed. Ends `committed` (or `failed`,
        `arm-timeout`, with nothing paused).""",
    ),
    Operation.resume: Action(JobRef, lambda executor, body: executor.resume(body.job_id), inline=True),
    Operation.abort: Action(JobRef, lambda executor, body: executor.abort(body.job_id), inline=False),
}


def _endpoint(operation: Operation, action: Action) -> Callable[..., Awaitable[JSONResponse]]:
    """The POST of `operation`: run the action, then, with `wait_s`, hold the answer until the
    operation's end phase (the protocol's `MOVES`), or one of `until`, is reached."""
    end_phase = frozenset({MOVES[operation].done})

    async def endpoint(
        body: BaseModel, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None
    ) -> JSONResponse:
        executor = agent.executor
        phases = _parse_until(until, end_phase)
        if action.inline:
            status = action.call(executor, body)
        else:
            status = await run_in_threadpool(action.call, executor, body)
        if wait_s > 0 and not _settled(status, phases):
            status = await _wait_until(executor, status.job_id, phases, wait_s, started=status)
        return JSONResponse(status.model_dump(mode="json"), status_code=202, headers=LONG_POLL_HEADERS)

    endpoint.__annotations__ = {**endpoint.__annotations__, "body": action.body}  # the body it parses
    endpoint.__name__ = endpoint.__qualname__ = operation.value
    endpoint.__doc__ = action.doc
    return endpoint


for _operation, _action in ACTIONS.items():
    router.add_api_route(
        _operation.path,
        _endpoint(_operation, _action),
        methods=["POST"],
        status_code=202,
        responses=RECONFIG_RESPONSES,
    )


@router.get("/v1/reconfig", responses=problem_responses(404, 409, 422))
async def reconfig_status(
    agent: AgentDep,
    response: Response,
    job_id: Annotated[
        str | None, Query(description="the job asked about; another job here answers 409 wrong-job")
    ] = None,
    until: Until = None,
    wait_s: WaitS = 0.0,
) -> ReconfigStatus:
    """The current (or last) reconfiguration. With `job_id` and `wait_s`: a bounded long-poll that
    answers as soon as that job is in one of `until`, terminal, or failed, else after `wait_s`."""
    response.headers.update(LONG_POLL_HEADERS)
    executor = agent.executor
    if job_id is None:
        if wait_s > 0:
            raise ProblemError(422, "invalid-request", "wait_s needs job_id")
        status: ReconfigStatus | None = executor.status()
        if status is None:
            raise ProblemError(404, "no-job", "no reconfiguration has run on this agent")
        return status
    phases = _parse_until(until, frozenset())
    if wait_s <= 0:
        return _status_of(executor, job_id)
    return await _wait_until(executor, job_id, phases, wait_s)
