"""Guessing made slow and cheap to refuse, on the agent and the coordinator alike (torch-free: the
coordinator imports it).

`FailureThrottle`: each client address may fail authentication `burst` times, then once per `refill_s`
(a token bucket of failures; successes cost nothing, so a busy client is never slowed by its own
calls). A client out of failures is answered 429 with `Retry-After` before its credential is looked
at, unless that credential already succeeded from the same address (`proven`): a legitimate client
that shares an address with a guesser keeps working, and a guesser learns nothing while it waits.
Credentials are remembered by digest only, per client, for `proven_ttl_s`; at most `max_clients`
addresses are tracked (the least recently seen is forgotten first), so a flood from many addresses
costs bounded memory.

`RefusalLog`: refused calls go to the log as one line for the first refusal of a quiet spell, then
one summary line per `interval_s` with counts by client and reason, never a line per call.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]


@dataclass
class _Client:
    failures_left: float
    at: float
    proven: dict[bytes, float] = field(default_factory=dict)  # credential digest -> last success


class FailureThrottle:
    """Failed authentications per client address (see the module doc). Thread-safe."""

    def __init__(
        self,
        *,
        burst: int = 10,
        refill_s: float = 1.0,
        proven_ttl_s: float = 3600.0,
        max_clients: int = 4096,
        max_proven: int = 16,
        clock: Clock = time.monotonic,
    ) -> None:
        self.burst = burst  # 0: off (nothing is ever throttled)
        self.refill_s = refill_s
        self.proven_ttl_s = proven_ttl_s
        self.max_clients = max_clients
        self.max_proven = max_proven
        self.clock = clock
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.burst > 0

    def _client(self, address: str, now: float) -> _Client:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = _Client(failures_left=float(self.burst), at=now)
            while len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(address)
            regained = (now - client.at) / self.refill_s if self.refill_s > 0 else math.inf
            client.failures_left = min(float(self.burst), client.failures_left + regained)
            client.at = now
        return client

    def retry_after(self, address: str, credential: bytes | None = None) -> float | None:
        """Seconds until `address` may fail again, when it may not now and `credential` (a digest)
        has not succeeded from it before; None: go on and check the credential."""
        if not self.enabled:
            return None
        with self._lock:
            now = self.clock()
            client = self._clients.get(address)
            if client is None:
                return None
            client = self._client(address, now)
            if client.failures_left >= 1.0:
                return None
            seen = client.proven.get(credential) if credential is not None else None
            if seen is not None and now - seen <= self.proven_ttl_s:
                return None
            return (1.0 - client.failures_left) * self.refill_s

    def failed(self, address: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            client = self._client(address, self.clock())
            client.failures_left = max(0.0, client.failures_left - 1.0)

    def succeeded(self, address: str, credential: bytes) -> None:
        """`credential` (a digest) worked from `address`: it keeps working there while it is throttled."""
        if not self.enabled:
            return
        with self._lock:
            now = self.clock()
            client = self._client(address, now)
            client.proven[credential] = now
            if len(client.proven) > self.max_proven:
                oldest = min(client.proven, key=client.proven.__getitem__)
                del client.proven[oldest]


def retry_after_header(seconds: float) -> str:
    """`Retry-After` in whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


class RefusalLog:
    """Refused calls as a few log lines (see the module doc). Thread-safe."""

    def __init__(
        self, logger: logging.Logger, *, interval_s: float = 30.0, clock: Clock = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # start of the spell being summed up (None: quiet)
        self._counts: Counter[tuple[str, str]] = Counter()  # (client, reason) -> refusals

    def refused(self, client: str, reason: str, detail: str) -> None:
        """One refusal: `reason` is a short fixed phrase ("wrong control key"), `detail` what the
        first line of a spell shows beside it ("GET /v1/info")."""
        summary: str | None = None
        first = False
        with self._lock:
            now = self.clock()
            if self._since is None:
                first, self._since = True, now
            elif now - self._since >= self.interval_s:
                summary = self._take_summary(now)  # and this refusal opens the next spell
                self._since = now
                self._counts[client, reason] += 1
            else:
                self._counts[client, reason] += 1
        if summary:
            self.logger.warning("%s", summary)
        if first:
            self.logger.warning(
                "refused %s from %s: %s (more refusals are summed up every %g s)",
                detail,
                client,
                reason,
                self.interval_s,
            )

    def flush(self, *, force: bool = False) -> None:
        """Log the summary of a spell that is over (or of any, with `force`: at shutdown)."""
        with self._lock:
            now = self.clock()
            due = self._since is not None and (force or now - self._since >= self.interval_s)
            summary = self._take_summary(now) if due else None
        if summary:
            self.logger.warning("%s", summary)

    def _take_summary(self, now: float) -> str | None:
        """The spell's summary line (None when only its first refusal happened), and a quiet start."""
        assert self._since is not None
        counts, self._counts = self._counts, Counter()
        seconds = now - self._since
        self._since = None
        if not counts:
            return None
        total = sum(counts.values())
        by_client: dict[str, Counter[str]] = {}
        for (client, reason), count in counts.items():
            by_client.setdefault(client, Counter())[reason] += count
        ranked = sorted(by_client.items(), key=lambda item: -sum(item[1].values()))
        shown = "; ".join(
            f"{client} x{sum(reasons.values())} ("
            + ", ".join(f"{reason} x{n}" for reason, n in reasons.most_common())
            + ")"
            for client, reasons in ranked[:5]
        )
        more = f"; and {len(ranked) - 5} more clients" if len(ranked) > 5 else ""
        clients = f"{len(ranked)} client{'s' if len(ranked) > 1 else ''}"
        return f"refused {total} more calls in the last {seconds:.0f} s from {clients}: {shown}{more}"
