"""One canary request: the interface a backend implements, and what one canary left behind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Every canary we send carries it: a front door tells our canaries from its clients' requests by it
# (`app.frontdoor.haproxy`: a job's accounting counts clients' requests apart).
CANARY_HEADER = "x-epctl-canary"


@dataclass(frozen=True)
class CanaryResult:
    """The answer to one canary: `ok` only for a real, successful answer (e.g. HTTP 200 with a token)."""

    ok: bool
    status: int | None = None  # the HTTP status, when there was an answer
    detail: str | None = None  # a short reason for a failure ("503 scaling", "connection refused")


class Canary(Protocol):
    """Sends one canary request to one target (a URL) and says how it went. May raise: the recorder
    counts an exception, or no answer within its timeout, as a failed canary."""

    async def send(self, target: str) -> CanaryResult: ...


@dataclass(frozen=True)
class CanarySample:
    """One canary as recorded: monotonic send and completion times (seconds)."""

    target: str
    sent_at: float
    done_at: float
    ok: bool
    status: int | None = None
    detail: str | None = None

    @property
    def latency_s(self) -> float:
        return self.done_at - self.sent_at
