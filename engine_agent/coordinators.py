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
