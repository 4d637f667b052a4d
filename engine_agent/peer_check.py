"""Which members of a broken generation still answer: the evidence the coordinator fences a frozen
member on, instead of waiting out its heartbeat timeout.

When a serving collective fails or runs past its deadline, the engine cannot tell from the collective
which peer stalled (a gloo ring or an all-to-all just stops). So each member that leaves the group asks
every other member's `/healthz` once, concurrently, with a short deadline: a live peer answers within
milliseconds even on a loaded host (its HTTP server is not the stalled serving loop), a frozen or dead
one does not. The names go out in the heartbeat (`unresponsive_peers`); the member that every survivor
names, and that has not heartbeated since, is fenced by the coordinator.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from engine_agent.protocol import StoreAddress
from engine_agent.tls import peer_context

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0  # far above a live agent's /healthz (ms), far below the heartbeat timeout
MAX_PARALLEL_PROBES = 16


@dataclass(frozen=True)
class BrokenGroup:
    """This engine's account of the last group that broke under it."""

    generation: int
    unresponsive: list[str] = field(default_factory=list)  # engine ids, in rank order


def reported_break(
    taken_in: BrokenGroup | None,
    taken_in_last_step_at: float | None,
    failed: int | None,
    last_step_at: float | None,
) -> tuple[BrokenGroup | None, float | None]:
    """What an idle engine's heartbeat says broke: the break the agent has taken in (with the peers it
    named), unless the serving loop has since given up a newer generation that the agent has not taken
    in yet (`EngineCounters.failed_generation`, set under the loop's lock): that one, with no names yet."""
    if failed is not None and (taken_in is None or taken_in.generation < failed):
        return BrokenGroup(failed), last_step_at
    return taken_in, taken_in_last_step_at if taken_in else None


def unresponsive_members(members: Sequence[tuple[str, str]], timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """The ids of `(engine_id, url)` members whose `/healthz` did not answer 200 within `timeout_s`."""
    if not members:
        return []

    def answers(url: str) -> bool:
        try:
            return (
                httpx.get(f"{url.rstrip('/')}/healthz", timeout=timeout_s, verify=peer_context()).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PROBES, len(members))) as pool:
        answered = list(pool.map(answers, [url for _, url in members]))
    return [engine_id for (engine_id, _), ok in zip(members, answered, strict=True) if not ok]


def check_peers(
    generation: int, members: Sequence[tuple[str, str]], report: Callable[[BrokenGroup], None]
) -> threading.Thread:
    """Probe `members` in a background thread, then `report` what was found."""

    def run() -> None:
        found = BrokenGroup(generation, unresponsive_members(members))
        if found.unresponsive:
            log.warning("generation %s broke; unresponsive members: %s", generation, found.unresponsive)
        report(found)

    thread = threading.Thread(target=run, name="peer-check", daemon=True)
    thread.start()
    return thread


DATA_PROBE_TIMEOUT_S = 0.5  # one TCP connect to a peer's data address on the same fabric: microseconds


class DataReach:
    """Which peers this engine's data network reaches: a TCP connect to each peer's data address (its
    rendezvous store listens there), every `interval_s`, in a thread of its own, so a heartbeat never
    waits for it. The peers are those of the engine's generation, or of the last one it was in (an
    engine a broken data link cut out keeps probing them, and says when they are back)."""

    def __init__(self, interval_s: float, peers: Callable[[], Sequence[tuple[str, StoreAddress]]]) -> None:
        self.interval_s = interval_s
        self._peers = peers
        self._unreachable: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="data-reach", daemon=True)
        self._thread.start()

    @property
    def unreachable(self) -> list[str]:
        return list(self._unreachable)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            peers = list(self._peers())
            if not peers:
                self._unreachable = []
                continue
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PROBES, len(peers))) as pool:
                reached = list(pool.map(lambda p: _connects(p[1]), peers))
            self._unreachable = [
                engine_id for (engine_id, _), ok in zip(peers, reached, strict=True) if not ok
            ]


def _connects(address: StoreAddress) -> bool:
    try:
        with socket.create_connection((address.host, address.port), timeout=DATA_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False
