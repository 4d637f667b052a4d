"""Each coordinator's presence row, renewed by its runner (`announce`), dropped on a clean stop
(`forget`); one is alive while its row is fresh (`PRESENCE_TTL_S`). HTTP-free."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.coordinators.models import Coordinator
from app.core.clock import utc_now

PRESENCE_INTERVAL_S = 2.0  # how often a coordinator renews its row
PRESENCE_TTL_S = 10.0  # a row older than this is a coordinator that died
# Every heartbeat's answer lists the live coordinators: read at most this often per database (the list
# is already up to PRESENCE_TTL_S old by design), not once per heartbeat (issue 37: 700 a second).
LIVE_URLS_MAX_AGE_S = 1.0
_live_cache: dict[tuple[int, str], tuple[float, list[str]]] = {}


def announce(session: Session, *, coordinator_id: str, url: str) -> None:
    """Insert or renew this coordinator's row (commits)."""
    now = utc_now()
    row = session.get(Coordinator, coordinator_id)
    if row is None:
        row = Coordinator(
            id=coordinator_id, url=url, hostname=socket.gethostname(), pid=os.getpid(), started_at=now
        )
    row.url, row.pid, row.last_seen_at = url, os.getpid(), now
    session.add(row)
    session.commit()


def forget(session: Session, *, coordinator_id: str) -> None:
    session.execute(sa.delete(Coordinator).where(col(Coordinator.id) == coordinator_id))
    session.commit()


def live_urls(session: Session, *, first: str | None = None) -> list[str]:
    """The URLs of the coordinators alive now, `first` (this one's) in front, each once."""
    fresh_since = utc_now() - timedelta(seconds=PRESENCE_TTL_S)
    rows = session.exec(
        select(Coordinator.url)
        .where(col(Coordinator.last_seen_at) >= fresh_since)
        .order_by(col(Coordinator.started_at))
    ).all()
    ordered = ([first] if first else []) + list(rows)
    return list(dict.fromkeys(url.rstrip("/") for url in ordered))


def live_urls_recent(session: Session) -> list[str]:
    """`live_urls`, read at most every `LIVE_URLS_MAX_AGE_S` per database engine (the heartbeat's answer)."""
    bind = session.get_bind()
    key = (id(bind), str(bind.engine.url))
    now = time.monotonic()
    cached = _live_cache.get(key)
    if cached is not None and now - cached[0] < LIVE_URLS_MAX_AGE_S:
        return list(cached[1])
    urls = live_urls(session)
    _live_cache[key] = (now, urls)
    return list(urls)
