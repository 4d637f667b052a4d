"""The coordinators an agent may heartbeat to, in the order it tries them.

Several coordinators can share one database (an HA pair); any of them takes an agent's heartbeat. The
set starts as the launch gave it and follows each answer's list of live coordinators; the one that
answered last is tried first. The launch's own URLs stay in the set: a coordinator restarted at the
same URL after every other died is found again.
"""

from __future__ import annotations

from collections.abc import Sequence


class CoordinatorSet:
    def __init__(self, launched_with: Sequence[str]) -> None:
        self._launched = [url.rstrip("/") for url in launched_with if url]
        self._order = list(dict.fromkeys(self._launched))

    def in_order(self) -> list[str]:
        return list(self._order)

    def answered(self, url: str, live: Sequence[str]) -> None:
        """`url` answered, naming `live` as the coordinators alive now."""
        url = url.rstrip("/")
        known = [u.rstrip("/") for u in live if isinstance(u, str) and u.startswith(("http://", "https://"))]
        self._order = list(dict.fromkeys([url, *known, *self._launched]))


def shed_retry_after_s(status: int, retry_after: str | None) -> float | None:
    """A saturated coordinator's answer to a heartbeat it heard but shed (503 with a numeric
    `Retry-After`, `app.core.shedding`): the seconds it asks to wait; None for any other answer."""
    if status != 503 or retry_after is None:
        return None
    try:
        seconds = float(retry_after.strip())
    except ValueError:
        return None  # an HTTP date: not what a coordinator sends
    return seconds if seconds >= 0 else None


def next_heartbeat_s(interval_s: float, retry_after_s: float | None) -> float:
    """The wait before the next heartbeat: the interval, stretched to a shed answer's Retry-After (the
    offered rate falls to what the coordinator can record instead of growing with retries)."""
    return max(interval_s, retry_after_s or 0.0)
