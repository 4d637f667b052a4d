"""Telling the other members of a generation that its group broke.

Gloo cannot abort a collective in flight, and a member whose ring neighbours are alive never sees the
dead peer's connection close: it would wait out its deadline. So the engine that found the group broken
tells every other member (`POST /v1/generation/broken`), each gives it up within one wait slice
(`engine_agent.groups.WAIT_SLICE_S`), and all of them report `group_error` to the coordinator together.
A member that gave up on such a notice does not pass it on (one round, not one per member).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from engine_agent.protocol import GenerationBroken
from engine_agent.tls import peer_context

log = logging.getLogger(__name__)

NOTICE_TIMEOUT_S = 2.0  # one peer's answer: a dead or frozen one must not hold the others' notices
MAX_PARALLEL_NOTICES = 16


def notify_peers(
    urls: Sequence[str], notice: GenerationBroken, *, headers: Mapping[str, str] | None = None
) -> threading.Thread:
    """Send `notice` to every URL, concurrently, in a background thread (best effort: a peer that does
    not answer is dead or frozen, and leaves at its own deadline). `headers`: the deployment's agent
    key (peers refuse an anonymous notice)."""
    thread = threading.Thread(
        target=_send_all, args=(list(urls), notice, dict(headers or {})), name="peer-notice", daemon=True
    )
    thread.start()
    return thread


def _send_all(urls: list[str], notice: GenerationBroken, headers: dict[str, str]) -> None:
    if not urls:
        return
    body = notice.model_dump(mode="json")
    with httpx.Client(timeout=NOTICE_TIMEOUT_S, headers=headers, verify=peer_context()) as client:

        def send(url: str) -> None:
            try:
                client.post(f"{url.rstrip('/')}/v1/generation/broken", json=body).raise_for_status()
            except httpx.HTTPError as exc:
                log.info("telling %s that generation %s broke: %s", url, notice.generation, exc)

        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_NOTICES, len(urls))) as pool:
            list(pool.map(send, urls))
