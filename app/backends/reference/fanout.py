"""One step on every engine at once, and the waits around it. No database: what a step learns goes into
the job's in-memory `JobRun.statuses`; progress and cancellation reach the database through callbacks
the flow passes in.

Each engine costs one HTTP exchange when its agent answers in time (the step's POST, held by the agent
until the step's phase, see `AgentClient._step`), then bounded long-polls of `GET /v1/reconfig`; every
engine is followed on its own, so nobody waits for a round of polls. Whether an engine got where it
was sent is decided by `engine_agent.protocol.is_settled`, the one rule shared with the agent client,
the tests and the benchmarks.

A call's deadline is final (`app.agents.errors.is_silence`): an agent that does not answer one call
within it (frozen: SIGSTOP, a GC pause, a swap storm; the kernel still accepts its connections) fails
the step at once, and is `silent` for the rest of the job: its abort is sent with a short deadline and
nobody waits for it to settle. (The step used to ask again until the step's own deadline, and the
rollback waited for every engine to settle for up to the longest agent step: a job whose participant
froze stayed `preparing` until the thaw.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from app.agents.client import AgentClient
from app.agents.errors import (
    AgentCallError,
    AgentDeadlineExceeded,
    AgentPhaseFailed,
    AgentSilent,
    AgentUnreachable,
    is_silence,
)
from app.agents.fleet import Fleet
from app.backends.base import JobCancelled, JobFailure
from app.backends.reference.job import JobRun, progress_fraction
from app.core.runner_settings import RunnerSettings
from engine_agent.protocol import (
    MAX_WAIT_S,
    TERMINAL_PHASES,
    ReconfigPhase,
    ReconfigStatus,
    Settlement,
    is_settled,
)

Send = Callable[[AgentClient, float], Awaitable[ReconfigStatus]]
OnProgress = Callable[[float], Awaitable[None]]
ShouldCancel = Callable[[], Awaitable[bool]]

# How often a step with progress or cancellation wakes up to report or check (seconds).
TICK_S = 0.2
# A participant's /healthz when another failed: a live agent answers in milliseconds. Also the deadline
# of the abort sent to an engine already silent in this job (sent so a thawed engine finds it; not
# waited for).
HEALTH_CHECK_S = 1.0


def _consume_outcome(future: asyncio.Future[Any]) -> None:
    """Mark a call's outcome seen: one left running after its waiter was cancelled must not log
    'exception was never retrieved'."""
    if not future.cancelled():
        future.exception()


class Fanout:
    """The agents of one job, driven together through `fleet`."""

    def __init__(self, fleet: Fleet, settings: RunnerSettings) -> None:
        self.fleet = fleet
        self.settings = settings

    async def drive(
        self,
        run: JobRun,
        clients: Sequence[AgentClient],
        phases: Collection[ReconfigPhase],
        *,
        job_phase: str,
        deadline_s: float,
        poll_interval_s: float,
        send: Send | None = None,
        on_progress: OnProgress | None = None,
        should_cancel: ShouldCancel | None = None,
    ) -> dict[str, ReconfigStatus]:
        """One step on every client at once: `send(client, wait_s)` (a step POST that the agent may
        hold until the step's phase; without `send`, start from the answer each client gave to its
        last step) and then, where that answer has not reached `phases`, long-polls.

        `deadline_s` covers the sends and the waits. Raises `JobFailure` at the first failure (any
        send error, an unreachable agent, an agent whose job failed, the deadline), after cancelling
        the waits still out (a step already on its way is let finish, so no engine misses it);
        `JobCancelled` as soon as `should_cancel()` says so (checked every `TICK_S`)."""
        wanted = frozenset(phases)
        give_up = time.monotonic() + deadline_s
        hold_s = self.settings.progress_long_poll_s if on_progress is not None else MAX_WAIT_S
        tasks = {
            c.engine_id: asyncio.create_task(
                self._follow(run, c, wanted, give_up, send, poll_interval_s, hold_s, deadline_s)
            )
            for c in clients
        }
        ticking = on_progress is not None or should_cancel is not None
        last_cancel_check = time.monotonic()
        pending: set[asyncio.Task[ReconfigStatus]] = set(tasks.values())
        try:
            while pending:
                # The engines' own waits end at the deadline; this bound only guards against a stuck call.
                timeout = give_up + 1.0 - time.monotonic()
                if ticking:
                    timeout = min(timeout, TICK_S)
                done, pending = await asyncio.wait(
                    pending, timeout=max(timeout, 0.0), return_when=asyncio.FIRST_COMPLETED
                )
                for client in clients:
                    task = tasks[client.engine_id]
                    error = task.exception() if task in done else None
                    if error is not None:
                        culprit = await self.silent_peer(client, clients, error) or error
                        if is_silence(culprit):
                            run.silent.add(getattr(culprit, "engine_id", client.engine_id))
                        raise JobFailure.from_exception(job_phase, culprit)
                if not pending:
                    break
                if on_progress is not None:
                    await on_progress(
                        progress_fraction(
                            run.statuses[c.engine_id] for c in clients if c.engine_id in run.statuses
                        )
                    )
                now = time.monotonic()
                if should_cancel is not None and now - last_cancel_check >= TICK_S:
                    last_cancel_check = now
                    if await should_cancel():
                        raise JobCancelled(job_phase)
                if now >= give_up + 1.0:
                    late = next(c.engine_id for c in clients if tasks[c.engine_id] in pending)
                    raise JobFailure.from_exception(job_phase, _late(run, late, wanted, deadline_s))
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            # The job names one failure; others of the same round are read here, or the collector
            # logs each as "Task exception was never retrieved" whenever it frees them.
            for task in tasks.values():
                if task.done():
                    _consume_outcome(task)
        if on_progress is not None:
            await on_progress(1.0)
        return {engine_id: task.result() for engine_id, task in tasks.items()}

    async def _follow(
        self,
        run: JobRun,
        client: AgentClient,
        wanted: frozenset[ReconfigPhase],
        give_up: float,
        send: Send | None,
        poll_interval_s: float,
        hold_s: float,
        deadline_s: float,
    ) -> ReconfigStatus:
        """One engine until it reaches `wanted`: its step's answer, then long-polls (or polls)."""
        status: ReconfigStatus | None
        if send is not None:
            # Shielded: when another engine fails first, this engine still gets its step (a switch
            # or pause half-sent would leave it behind); only the wait for its answer is dropped.
            sending = asyncio.ensure_future(send(client, max(min(give_up - time.monotonic(), hold_s), 0.0)))
            sending.add_done_callback(_consume_outcome)
            status = await asyncio.shield(sending)
        else:
            status = client.last_step_status
        while True:
            if status is not None and status.job_id == run.job_id:
                run.statuses[client.engine_id] = status
            settlement = is_settled(status, run.job_id, wanted)
            if settlement is not Settlement.pending:
                assert status is not None
                if settlement is Settlement.failed:
                    raise AgentPhaseFailed(client.engine_id, status, wanted)
                return status
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                raise _late(run, client.engine_id, wanted, deadline_s)
            try:
                status = await client.watch(run.job_id, wanted, wait_s=min(remaining, hold_s))
            except AgentCallError as exc:
                if is_silence(exc):
                    raise  # gone, or no answer within the call's deadline: frozen, not slow
                status = None  # it answered, with an error (a refusal, a 5xx): ask again
            if status is None or not client.long_poll:
                # Not held by the agent (no job there yet, an error, or an agent that cannot hold).
                await asyncio.sleep(min(poll_interval_s, max(give_up - time.monotonic(), 0.0)))

    async def silent_peer(
        self, failed: AgentClient, clients: Sequence[AgentClient], error: BaseException
    ) -> AgentCallError | None:
        """When an engine fails, the cause may be another that died or froze (a survivor's transfer
        or collective broke on it): the participant that does not answer a health check, if one, is
        what the job names, never a healthy engine that failed because of it."""
        if (
            isinstance(error, AgentUnreachable | AgentDeadlineExceeded)
            and error.engine_id == failed.engine_id
        ):
            return None  # the failing engine is the one that does not answer
        others = [c for c in clients if c.engine_id != failed.engine_id]
        if not others:
            return None
        answers = await self.fleet.each(others, lambda c: c.health(timeout_s=HEALTH_CHECK_S))
        for client in others:
            answer = answers[client.engine_id]
            if isinstance(answer, AgentCallError):
                kind = AgentUnreachable if isinstance(answer, AgentUnreachable) else AgentSilent
                because = getattr(error, "message", str(error))
                return kind(
                    client.engine_id,
                    f"did not answer a health check ({answer.message}); "
                    f"{failed.engine_id} failed meanwhile: {because}"[:2000],
                )
        return None

    async def await_settled(
        self, run: JobRun, clients: Sequence[AgentClient], phases: Collection[ReconfigPhase]
    ) -> None:
        """Best effort, after an abort: wait until every reachable agent's job settled (reached one of
        `phases`, or failed), at most the abort deadline or the longest step an agent may be finishing
        (its abort first lets its running step end: a rendezvous, a collective, a transfer)."""
        settings = self.settings
        give_up = time.monotonic() + max(settings.abort_deadline_s, settings.longest_agent_step_s())
        waiting = {c.engine_id: c for c in clients}
        while waiting and time.monotonic() < give_up:
            results = await self.fleet.each(waiting.values(), lambda c: c.reconfig())
            for engine_id, result in results.items():
                if isinstance(result, AgentCallError) and is_silence(result):
                    run.silent.add(engine_id)  # gone or frozen: its own deadlines end its step
                    waiting.pop(engine_id)
                elif isinstance(result, AgentCallError):
                    continue
                elif result is None or result.job_id != run.job_id:
                    waiting.pop(engine_id)  # it no longer holds this job: nothing to wait for
                else:
                    run.statuses[engine_id] = result
                    if is_settled(result, run.job_id, phases) is not Settlement.pending:
                        waiting.pop(engine_id)
            if waiting:
                await asyncio.sleep(settings.agent_poll_interval_s)

    async def read_statuses(self, run: JobRun, clients: Sequence[AgentClient]) -> None:
        """Each reachable agent's status of this job, into `run.statuses`. An engine silent in this job
        is not asked again: a frozen one would hold the job's end for a call's deadline."""
        asked = [c for c in clients if c.engine_id not in run.silent]
        results = await self.fleet.each(asked, lambda c: c.reconfig())
        for engine_id, result in results.items():
            if isinstance(result, ReconfigStatus) and result.job_id == run.job_id:
                run.statuses[engine_id] = result

    async def abort_all(
        self, run: JobRun, clients: Sequence[AgentClient], phases: Collection[ReconfigPhase]
    ) -> None:
        """`abort` on every client (the agents' one way back from any phase before the switch: it
        resumes a paused engine on the generation it still holds and destroys what prepare built),
        then wait for the ones that answer to settle. An engine silent in this job is sent its abort
        with a short deadline (a thawed engine finds it) and not waited for."""

        def abort(client: AgentClient) -> Awaitable[ReconfigStatus]:
            silent = client.engine_id in run.silent
            return client.abort(run.job_id, timeout_s=HEALTH_CHECK_S if silent else None)

        results = await self.fleet.each(clients, abort)
        run.silent.update(e for e, r in results.items() if isinstance(r, AgentCallError) and is_silence(r))
        await self.await_settled(run, [c for c in clients if c.engine_id not in run.silent], phases)

    async def busy_with_other_jobs(self, run: JobRun, clients: Sequence[AgentClient]) -> dict[str, str]:
        """The engines still running another job (an abort finishing, or a job a crashed coordinator
        left behind), by engine id -> that job's id."""
        statuses = await self.fleet.each(clients, lambda c: c.reconfig())
        return {
            engine_id: status.job_id
            for engine_id, status in statuses.items()
            if isinstance(status, ReconfigStatus) and status.job_id != run.job_id and _active(status)
        }

    async def settle_other_jobs(self, clients: Sequence[AgentClient], busy: dict[str, str]) -> None:
        """Abort the other jobs `busy` names (one deployment has one active job, so any other is stale)
        and wait until those engines are free, so this job's prepare is not refused."""
        by_id = {c.engine_id: c for c in clients}
        await self.fleet.each([by_id[e] for e in busy], lambda c: c.abort(busy[c.engine_id]))
        settings = self.settings
        give_up = time.monotonic() + settings.longest_agent_step_s() + settings.abort_deadline_s
        left = dict(busy)
        while left and time.monotonic() < give_up:
            await asyncio.sleep(settings.agent_poll_interval_s)
            results = await self.fleet.each([by_id[e] for e in left], lambda c: c.reconfig())
            for engine_id, result in results.items():
                if not isinstance(result, ReconfigStatus) or not _active(result):
                    left.pop(engine_id, None)


def _active(status: ReconfigStatus) -> bool:
    """Whether the agent still holds this job (it refuses another until the job is terminal)."""
    return status.phase not in TERMINAL_PHASES


def _late(
    run: JobRun, engine_id: str, wanted: frozenset[ReconfigPhase], deadline_s: float
) -> AgentDeadlineExceeded:
    status = run.statuses.get(engine_id)
    where = f" (agent at {status.phase.value}, step {status.step})" if status else ""
    return AgentDeadlineExceeded(
        engine_id, f"did not reach {'/'.join(sorted(wanted))} within {deadline_s:.1f}s{where}"
    )
