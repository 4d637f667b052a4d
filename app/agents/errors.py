"""What a failed call to an agent raises: typed errors carrying the engine id, a machine-readable
(kebab-case) type and a message (`app.core.faults.EngineFault`, the base they share with launch and
plan failures), so a job records its `JobError` without looking at HTTP.

- `AgentUnreachable`: the connection failed (the agent is down or not listening);
- `AgentDeadlineExceeded`: no answer within the call's deadline, or a wait ran out of time;
  `AgentSilent`, its kind for one call that got no answer at all (a frozen agent: the kernel accepted
  the connection, nothing ever answers), which is evidence about the agent, not about a phase;
- `AgentProblem`: the agent answered with an error (problem+json: its `type` and `detail`);
- `AgentPhaseFailed`: the reconfiguration the agent runs failed instead of reaching the phase awaited
  (failed, aborted, ...); carries the agent's `ReconfigStatus`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from app.core.faults import EngineFault
from engine_agent.problems import TYPE_PREFIX
from engine_agent.protocol import ReconfigPhase, ReconfigStatus


class AgentCallError(EngineFault):
    """A call to one agent failed."""

    type: str = "agent-error"
    engine_id: str

    def __init__(self, engine_id: str, message: str, *, type_: str | None = None) -> None:
        super().__init__(message, engine_id, type_=type_)

    def __str__(self) -> str:
        return f"{self.engine_id}: {self.message}"


class AgentUnreachable(AgentCallError):
    type = "agent-unreachable"


class AgentDeadlineExceeded(AgentCallError):
    type = "deadline-exceeded"


class AgentSilent(AgentDeadlineExceeded):
    """One call got no answer within its deadline (the agent is frozen, or its host stalled that long):
    recorded as `deadline-exceeded` like any deadline, but a waiter treats the agent as silent."""


def is_silence(error: BaseException) -> bool:
    """Whether `error` says the agent itself does not answer (gone, or silent past a call's deadline),
    rather than that it answered something unwelcome or was late to reach a phase."""
    return isinstance(error, AgentUnreachable | AgentSilent)


class AgentProblem(AgentCallError):
    """The agent answered with an HTTP error; `type` is the problem's type (or `http-<status>`)."""

    def __init__(self, engine_id: str, status_code: int, type_: str, message: str) -> None:
        super().__init__(engine_id, message, type_=type_)
        self.status_code = status_code


class AgentPhaseFailed(AgentCallError):
    """The agent's reconfiguration ended somewhere other than the phase awaited."""

    def __init__(self, engine_id: str, status: ReconfigStatus, expected: Collection[ReconfigPhase]) -> None:
        if status.error is not None:
            type_, message = status.error.type, status.error.message
            if status.error.step:
                message = f"{message} (at {status.error.step})"
        else:
            type_ = f"unexpected-phase-{status.phase.value}"
            wanted = "/".join(p.value for p in expected)
            message = f"reached {status.phase.value} while waiting for {wanted}"
        super().__init__(engine_id, message, type_=type_)
        self.status = status


def problem_type(body: Any, status_code: int) -> tuple[str, str]:
    """(type, message) from a problem+json body, tolerant of plain FastAPI errors. The type is the
    problem's `code` (our agents send one), else the last part of its `type` URI."""
    if isinstance(body, dict):
        code, raw_type = body.get("code"), body.get("type")
        if isinstance(code, str) and code:
            type_ = code
        elif raw_type and raw_type != "about:blank":
            type_ = str(raw_type).removeprefix(TYPE_PREFIX).rstrip("/").rsplit("/", 1)[-1]
        else:
            type_ = f"http-{status_code}"
        message = body.get("detail") or body.get("title") or body.get("message")
        if message is None and "error" in body:
            message = body["error"]
        return type_, str(message if message is not None else body)
    return f"http-{status_code}", str(body)
