"""The reconfiguration: one POST per operation, and `GET /v1/reconfig`, a bounded long-poll.

An action answers 202 with the job's status at once, or, given `wait_s`, once its end phase (the
protocol's `MOVES`, or one of `until`) is reached, the job is terminal or reports an error
(`protocol.is_settled`), at most `wait_s` later (capped at `MAX_WAIT_S`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

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


async def _accepted(
    executor: ReconfigExecutor,
    operation: Operation,
    action: Callable[[], ReconfigStatus],
    wait_s: float,
    until: str | None,
    *,
    inline: bool = False,
) -> JSONResponse:
    """Run the action, then, with `wait_s`, hold the answer until the operation's end phase (the
    protocol's `MOVES`), or one of `until`, is reached. `inline`: the action only touches the
    executor's own state (briefly, under its lock) and runs on the event loop, saving a thread hop
    inside the commit window; otherwise it may call into the engine and runs in the thread pool."""
    phases = _parse_until(until, frozenset({MOVES[operation].done}))
    status = action() if inline else await run_in_threadpool(action)
    if wait_s > 0 and not _settled(status, phases):
        status = await _wait_until(executor, status.job_id, phases, wait_s, started=status)
    return JSONResponse(status.model_dump(mode="json"), status_code=202, headers=LONG_POLL_HEADERS)


@router.post(Operation.prepare.path, status_code=202, responses=RECONFIG_RESPONSES)
async def prepare(
    body: PrepareRequest, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None
) -> JSONResponse:
    executor = agent.executor
    return await _accepted(executor, Operation.prepare, lambda: executor.prepare(body), wait_s, until)


@router.post(Operation.sync.path, status_code=202, responses=RECONFIG_RESPONSES)
async def sync(body: JobRef, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None) -> JSONResponse:
    executor = agent.executor
    return await _accepted(
        executor, Operation.sync, lambda: executor.sync(body.job_id), wait_s, until, inline=True
    )


@router.post(Operation.pause.path, status_code=202, responses=RECONFIG_RESPONSES)
async def pause(
    body: PauseRequest, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None
) -> JSONResponse:
    executor = agent.executor
    return await _accepted(
        executor,
        Operation.pause,
        lambda: executor.pause(body.job_id, body.lease_s),
        wait_s,
        until,
        inline=True,
    )


@router.post(Operation.switch.path, status_code=202, responses=RECONFIG_RESPONSES)
async def switch(body: JobRef, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None) -> JSONResponse:
    executor = agent.executor
    return await _accepted(
        executor, Operation.switch, lambda: executor.switch(body.job_id), wait_s, until, inline=True
    )


@router.post(Operation.arm.path, status_code=202, responses=RECONFIG_RESPONSES)
async def arm(body: ArmRequest, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None) -> JSONResponse:
    """The engine-agreed commit: arm for the new generation; the engines pause, switch and resume
    at the first step boundary at which all of them are armed. Ends `committed` (or `failed`,
    `arm-timeout`, with nothing paused)."""
    executor = agent.executor
    return await _accepted(
        executor,
        Operation.arm,
        lambda: executor.arm(body.job_id, body.deadline_s, body.lease_s, body.max_downtime_ms),
        wait_s,
        until,
        inline=True,
    )


@router.post(Operation.resume.path, status_code=202, responses=RECONFIG_RESPONSES)
async def resume(body: JobRef, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None) -> JSONResponse:
    executor = agent.executor
    return await _accepted(
        executor, Operation.resume, lambda: executor.resume(body.job_id), wait_s, until, inline=True
    )


@router.post(Operation.abort.path, status_code=202, responses=RECONFIG_RESPONSES)
async def abort(body: JobRef, agent: AgentDep, wait_s: WaitS = 0.0, until: Until = None) -> JSONResponse:
    executor = agent.executor
    return await _accepted(executor, Operation.abort, lambda: executor.abort(body.job_id), wait_s, until)


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
