"""Job leases: which coordinator runs which job.

A job is run by the coordinator holding its lease (`lease_owner`, `lease_expires_at`). A claim is one
`UPDATE ... WHERE the lease is free or expired`, so two coordinators on one Postgres never run the same
job; the holder renews the lease while it works (every third of its length), and a coordinator that
finds a non-terminal job whose lease expired (its holder died), or that it held itself before a
restart, claims it to reconcile it from what the agents report (`recovery.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from app.core.clock import utc_now
from app.jobs.models import ReconfigurationJob
from app.jobs.states import TERMINAL_STATES, JobState

TERMINAL_VALUES = sorted(s.value for s in TERMINAL_STATES)
_TABLE: Any = ReconfigurationJob.__table__  # type: ignore[attr-defined]


class Leases:
    """The lease queries of one coordinator (`owner`), run in the caller's session (worker threads).

    `running` is a snapshot of the job ids this coordinator drives right now: a lease it holds on
    any other job is left over from before a restart, so it may be claimed again."""

    def __init__(self, owner: str, lease_s: float) -> None:
        self.owner = owner
        self.lease_s = lease_s
        self.running: frozenset[str] = frozenset()

    def set_running(self, job_ids: Iterable[str]) -> None:
        self.running = frozenset(job_ids)

    def _free(self, now: Any) -> Any:
        table = _TABLE
        return sa.or_(
            table.c.lease_owner.is_(None),
            table.c.lease_expires_at.is_(None),
            table.c.lease_expires_at < now,
            sa.and_(table.c.lease_owner == self.owner, table.c.id.not_in(sorted(self.running) or [""])),
        )

    def _try_claim(self, session: Session, job_id: str, extra: Any = None) -> bool:
        table = _TABLE
        now = utc_now()
        statement = (
            sa.update(table)
            .where(table.c.id == job_id, table.c.state.not_in(TERMINAL_VALUES), self._free(now))
            .values(lease_owner=self.owner, lease_expires_at=now + timedelta(seconds=self.lease_s))
        )
        if extra is not None:
            statement = statement.where(extra)
        claimed = session.execute(statement).rowcount == 1  # type: ignore[attr-defined]
        session.commit()
        return claimed

    def claim_pending(self, session: Session) -> str | None:
        """The oldest pending job whose lease is free, now ours; None if there is none."""
        claimed = self.claim_pending_jobs(session, 1)
        return claimed[0] if claimed else None

    def claim_pending_jobs(self, session: Session, at_most: int) -> list[str]:
        """Up to `at_most` pending jobs whose leases are free, oldest first, now ours (issue 37: 128
        deployments forming at once were claimed one per runner turn, and a turn also runs the periodic
        passes over the whole fleet, so the last job started minutes after the first)."""
        table = _TABLE
        taken: list[str] = []
        tried: set[str] = set()
        while len(taken) < at_most:
            candidates = session.execute(
                sa.select(table.c.id)
                .where(table.c.state == JobState.pending.value, self._free(utc_now()))
                .order_by(table.c.created_at)
                .limit(at_most - len(taken) + len(tried) + 5)
            ).all()
            fresh = [str(j) for (j,) in candidates if j not in self.running and j not in tried]
            if not fresh:
                break
            for job_id in fresh[: at_most - len(taken)]:
                tried.add(job_id)  # a job we took is still "free" to us until `set_running` names it
                if self._try_claim(session, job_id, table.c.state == JobState.pending.value):
                    taken.append(job_id)
        return taken

    def claim_stranded(self, session: Session) -> list[str]:
        """Jobs past pending whose holder is gone (lease expired) or was us before a restart."""
        table = _TABLE
        candidates = session.execute(
            sa.select(table.c.id).where(
                table.c.state.not_in([*TERMINAL_VALUES, JobState.pending.value]), self._free(utc_now())
            )
        ).all()
        claimed = []
        for (job_id,) in candidates:
            if job_id not in self.running and self._try_claim(session, job_id):
                claimed.append(str(job_id))
        return claimed

    def extend(self, session: Session, job_id: str) -> bool:
        """Renew our lease on `job_id`. False when another coordinator holds it now; a job that
        reached a terminal state dropped its lease, which is the end of the work, not a loss (True)."""
        table = _TABLE
        result = session.execute(
            sa.update(table)
            .where(table.c.id == job_id, table.c.lease_owner == self.owner)
            .values(lease_expires_at=utc_now() + timedelta(seconds=self.lease_s))
        )
        session.commit()
        if result.rowcount == 1:  # type: ignore[attr-defined]
            return True
        job = session.get(ReconfigurationJob, job_id)
        return job is not None and JobState(job.state) in TERMINAL_STATES

    def release_all(self, session: Session) -> None:
        """Let our leases go (shutdown), so another coordinator or our successor reconciles at once."""
        table = _TABLE
        session.execute(
            sa.update(table)
            .where(table.c.lease_owner == self.owner, table.c.state.not_in(TERMINAL_VALUES))
            .values(lease_expires_at=utc_now())
        )
        session.commit()
