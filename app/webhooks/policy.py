"""How the delivery worker retries: the backoff schedule (with jitter), `Retry-After`, and its limits."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime

from app.core.config import Settings
from app.core.targets import IPNetwork

# A receiver may ask for a long pause, but not for longer than a day.
MAX_RETRY_AFTER_S = 86400.0


@dataclass(frozen=True)
class DeliveryPolicy:
    poll_s: float = 0.5
    timeout_s: float = 10.0
    retry_base_s: float = 2.0
    retry_max_s: float = 600.0
    max_attempts: int = 12
    claim_lease_s: float = 60.0
    concurrency: int = 8
    dispatch_batch: int = 100
    jitter: float = 0.0  # each delay times a factor in [1 - jitter, 1 + jitter]
    ordered: bool = True  # one delivery in flight per subscription, oldest event first
    disabled_backlog: int = 1000  # events queued for a disabled subscription, at most
    # Networks deliveries may go to besides public addresses (`app.core.targets`); none by default.
    allow_networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> DeliveryPolicy:
        return cls(
            poll_s=settings.webhook_poll_s,
            timeout_s=settings.webhook_timeout_s,
            retry_base_s=settings.webhook_retry_base_s,
            retry_max_s=settings.webhook_retry_max_s,
            max_attempts=settings.webhook_max_attempts,
            # A lease shorter than an attempt would let a second worker retry a delivery still in flight.
            claim_lease_s=max(settings.webhook_claim_lease_s, settings.webhook_timeout_s + 1.0),
            jitter=settings.webhook_retry_jitter,
            ordered=settings.webhook_ordered,
            disabled_backlog=settings.webhook_disabled_backlog,
            allow_networks=settings.webhook_networks,
        )

    def plain_backoff_s(self, attempts_made: int) -> float:
        """The delay after `attempts_made` attempts, before jitter."""
        return float(min(self.retry_base_s * 2 ** max(attempts_made - 1, 0), self.retry_max_s))

    def backoff_s(self, attempts_made: int, *, rng: random.Random | None = None) -> float:
        delay = self.plain_backoff_s(attempts_made)
        if self.jitter <= 0:
            return delay
        return delay * (1.0 + (rng or random).uniform(-self.jitter, self.jitter))

    def schedule_s(self) -> list[float]:
        """The delays between attempts, before jitter: `max_attempts - 1` of them."""
        return [self.plain_backoff_s(n) for n in range(1, self.max_attempts)]

    def span_s(self) -> float:
        """From the first attempt to the last, before jitter (attempt durations left out)."""
        return sum(self.schedule_s())


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """`Retry-After` as seconds from `now`: delta-seconds or an HTTP date; None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        seconds = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = (when - now).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)
