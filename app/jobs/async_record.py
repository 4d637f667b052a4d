"""A running job's record, written from async code: each piece of database work in a worker thread with
a session of its own, so the event loop keeps driving engines meanwhile.

`WorkerSessions` is that worker-thread session, for any async code (the runner's periodic work);
`AsyncJobRecord` adds what every backend's job record shares (`app.backends.base.FlowRecord`): the
transition step and the cancel check, raising what the flow stops on when the writer refuses a move.
The writer itself is `app.jobs.transitions`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.jobs.models import ReconfigurationJob
from app.jobs.states import CancelPendingError, JobState, TransitionError
from app.jobs.transitions import transition

T = TypeVar("T")


class RunningJob(Protocol):
    """What a flow keeps of its job: which one, and the state it last moved it to."""

    job_id: str
    state: JobState


J = TypeVar("J", bound=RunningJob)


class WorkerSessions:
    """Database work from async code, on one database."""

    def __init__(self, db: DbEngine) -> None:
        self.db = db

    async def run_in_session(self, work: Callable[[Session], T]) -> T:
        """`work(session)` in a worker thread; objects stay readable after the commit."""

        def run() -> T:
            with Session(self.db, expire_on_commit=False) as session:
                return work(session)

        return await asyncio.to_thread(run)


class AsyncJobRecord(WorkerSessions, ABC, Generic[J]):
    """The writes every job flow makes, on one database."""

    async def move(
        self,
        job: J,
        to_state: JobState,
        *,
        message: str | None = None,
        changes: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        also: Callable[[Session], None] | None = None,
    ) -> None:
        """One job transition (compare-and-set + log + outbox); `also` adds the deployment's and engines'
        changes to the same transaction. A move the writer refuses writes nothing and raises
        `cancelled(job)` when it would leave the cancellable states over a pending cancel,
        `moved_on(reason)` when the job is no longer in the state this flow left it in."""

        def work(session: Session) -> None:
            if also is not None:
                also(session)
            transition(
                session,
                job_id=job.job_id,
                from_state=job.state,
                to_state=to_state,
                message=message,
                data=data,
                changes=changes,
            )

        try:
            await self.run_in_session(work)
        except CancelPendingError as exc:
            raise self.cancelled(job) from exc
        except TransitionError as exc:
            raise self.moved_on(str(exc)) from exc
        job.state = to_state

    async def cancel_requested(self, job: J) -> bool:
        """Whether a cancel of the job is pending, read afresh (not from the session's cache)."""

        def read(session: Session) -> bool:
            row = session.get(ReconfigurationJob, job.job_id, populate_existing=True)
            return bool(row and row.cancel_requested)

        return await self.run_in_session(read)

    @abstractmethod
    def cancelled(self, job: J) -> Exception:
        """What the flow raises when a pending cancel stopped its move."""

    @abstractmethod
    def moved_on(self, reason: str) -> Exception:
        """What the flow raises when its job moved under it (an operator cancelled it, another
        coordinator claimed it)."""
