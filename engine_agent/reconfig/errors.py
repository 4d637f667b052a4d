"""How a reconfiguration step fails, and how each failure reads in the job's status.

Every `type` here is a kebab-case code (the style `engine_agent.problems` documents): `Conflict` and
`InvalidRequest` become the HTTP answer to the call (409, 422); any other failure of a running step
becomes the job's `AgentError`, whose `type` the coordinator copies into its job record."""

from __future__ import annotations

from engine_agent.groups import CollectiveTimeout, GroupRendezvousTimeout, PeerLost
from engine_agent.protocol import AgentError, DowntimeOverrun
from engine_agent.serving import EngineUnavailable
from engine_agent.transfer import TransferError, TransferTimeout


class ReconfigError(Exception):
    """A reconfiguration step failed; `type` is the machine-readable AgentError type."""

    def __init__(
        self,
        type_: str,
        message: str,
        engines: list[str] | None = None,
        overrun: DowntimeOverrun | None = None,
    ) -> None:
        super().__init__(message)
        self.type = type_
        self.engines = engines or []
        self.overrun = overrun


class Conflict(Exception):
    """The call does not fit the current job or phase (HTTP 409)."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(message)
        self.type = type_


class InvalidRequest(Exception):
    """The request cannot be carried out as given (HTTP 422)."""


class Aborted(Exception):
    """The job was aborted while a step ran: the abort owns the outcome, the step just stops."""


# Exceptions of the parts a step uses, and the type each is reported as. Subclasses come first.
_TYPE_OF: list[tuple[type[Exception], str]] = [
    (GroupRendezvousTimeout, "rendezvous-timeout"),
    (PeerLost, "peer-lost"),
    (CollectiveTimeout, "collective-timeout"),
    (TransferTimeout, "transfer-timeout"),
    (TransferError, "transfer-failed"),
    (EngineUnavailable, "engine-unavailable"),
]


def agent_error_of(exc: Exception, step: str | None) -> AgentError:
    """The status's error for a step that raised `exc`. An exception nobody expected is reported as
    `internal-error`, its class named in the message."""
    if isinstance(exc, ReconfigError):
        return AgentError(
            type=exc.type, message=str(exc), step=step, engines=exc.engines, overrun=exc.overrun
        )
    for exc_type, type_ in _TYPE_OF:
        if isinstance(exc, exc_type):
            return AgentError(type=type_, message=str(exc), step=step)
    return AgentError(type="internal-error", message=f"{type(exc).__name__}: {exc}", step=step)
