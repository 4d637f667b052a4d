"""The job runner: claims jobs and runs each in its own task, and ticks the scheduled work.

    loop -> leases      (claim pending and stranded jobs, renew, release)
         -> backends    (a pending job's run, or a job a dead coordinator left reconciled, by the
                         deployment's backend: `app.backends`, picked by the registry; each backend's
                         periodic work, such as the reference engines' liveness, and what it runs
                         beside the loop from `start` to `stop`)
         -> scheduled   (desired sizes, retention)

The reference backend gives each job its own `Fleet` over the runner's one agent session (aiohttp: a
kept-alive connection per agent, shared by jobs, recovery, adoption and the cleanup poller), with the
coordinator's `EPCTL_AGENT_TIMEOUT_S` as each call's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from functools import partial

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.agents.fleet import Fleet
from app.agents.transport import AgentSession
from app.backends.base import BackendContext, Backends, JobMovedOn, Periodic
from app.backends.registry import builtin_backends
from app.coordinators import service as coordinators
from app.core.errors import DomainError
from app.core.runner_settings import RunnerSettings
from app.core.wake import Bell
from app.jobs.async_record import WorkerSessions
from app.jobs.service import cancel_job
from app.launchers.base import Launcher
from app.runner.leases import Leases
from app.runner.scheduled import Retention, Scheduled, scheduled_tasks

log = logging.getLogger(__name__)

DEFAULT_AGENT_TIMEOUT_S = 5.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 15.0
# Pending jobs one turn of the loop claims (oldest first): every one waiting, up to this many (a turn
# also runs the periodic passes, so one claim per turn started the 128th of 128 jobs minutes late).
CLAIMS_PER_TURN = 64


class JobRunner:
    def __init__(
        self,
        db: DbEngine,
        *,
        launchers: Mapping[str, Launcher],
        lease_s: float = 30.0,
        agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        settings: RunnerSettings | None = None,
        new_fleet: Callable[[], Fleet] | None = None,
        retention: Retention | None = None,
        backends: Callable[[BackendContext], Backends] = builtin_backends,
    ) -> None:
        """`new_fleet` makes the agent clients of one job (default: HTTP, `agent_timeout_s` per call);
        `backends` makes the backends jobs run through, from what this runner gives them."""
        self.settings = settings or RunnerSettings()
        self.agent_timeout_s = agent_timeout_s
        self._new_fleet = new_fleet
        self._agent_session = AgentSession()
        owner = self.settings.coordinator_id or f"{socket.gethostname()}:{os.getpid()}"
        self.record = WorkerSessions(db)
        self.leases = Leases(owner, lease_s)
        self.launchers = launchers
        self.backends = backends(
            BackendContext(
                db, owner, self.settings, launchers, self.new_fleet, heartbeat_timeout_s, agent_timeout_s
            )
        )
        self.scheduled = Scheduled(
            [
                Periodic("presence", coordinators.PRESENCE_INTERVAL_S, self._announce),
                *self.backends.periodic(),
                *scheduled_tasks(self.record, self.settings, retention),
            ]
        )
        self._running: dict[str, asyncio.Task[None]] = {}
        self._bell = Bell()  # news a periodic task must judge now (`app.core.wake`)
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False

    async def _announce(self) -> None:
        """This coordinator's presence row: agents learn every live coordinator from their heartbeats."""
        if self.settings.public_url:
            url = self.settings.public_url
            await self.record.run_in_session(
                lambda s: coordinators.announce(s, coordinator_id=self.leases.owner, url=url)
            )

    def new_fleet(self) -> Fleet:
        if self._new_fleet is not None:
            return self._new_fleet()
        return Fleet(timeout_s=self.agent_timeout_s, session=self._agent_session)

    async def start(self) -> None:
        """Claim and run jobs in the background (a predecessor's are reconciled as they are found), and
        start what the backends run beside the loop (the reference backend's adoption, awaited: the
        lifespan serves no request until it decided, so a restarted coordinator never answers `ready`
        for a deployment with a member that does not answer)."""
        if not self.settings.enabled:
            return
        self._bell.start()
        self._loop_task = asyncio.create_task(self._loop(), name="job-runner")
        await self.backends.start()

    async def stop(self, *, end_jobs: bool = False) -> None:
        """An orderly stop: claim nothing more and hand the jobs running here over (their leases
        released: a successor, an HA peer or the next start, reconciles them at once). With `end_jobs`
        (its engines are about to be stopped too: `epctl up`), end them first (`_end_jobs`)."""
        self._stopping = True
        self._bell.close()
        await self.backends.stop()  # nothing starts a new job (self-healing) while they end
        if end_jobs:
            await self._end_jobs()
        tasks = [t for t in [self._loop_task, *self._running.values()] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # Let our leases go so another coordinator (or our successor) reconciles without waiting, and
        # leave the coordinators' list: agents stop trying us.
        with contextlib.suppress(Exception):
            await self.record.run_in_session(self.leases.release_all)
        with contextlib.suppress(Exception):
            await self.record.run_in_session(
                lambda s: coordinators.forget(s, coordinator_id=self.leases.owner)
            )
        await self._agent_session.aclose()

    async def _end_jobs(self) -> None:
        """Each job running here is asked to cancel (before its commit it rolls back and ends
        `cancelled`; inside its commit it finishes), and waited for, at most as long as a commit may
        take: a stop leaves no job half-run behind (one left `preparing` until the next start)."""
        running = dict(self._running)
        if not running:
            return

        def ask(session: Session) -> None:
            for job_id in running:
                with contextlib.suppress(DomainError):  # gone, or in its commit: it ends by itself
                    cancel_job(session, job_id=job_id, requester="the coordinator stopping")

        try:
            await self.record.run_in_session(ask)
        except Exception:
            log.exception("stopping: asking the running jobs to cancel failed")
        settings = self.settings
        grace = max(settings.abort_deadline_s, settings.arm_deadline_s + settings.switch_deadline_s)
        log.warning("stopping: ending %s first (at most %.0f s)", ", ".join(sorted(running)), grace)
        _, left = await asyncio.wait(running.values(), timeout=grace)
        if left:
            log.warning("stopping: %d job(s) did not end in time; handed over", len(left))

    async def tick(self) -> None:
        """One pass: claim what can be claimed, spawn its work, run the scheduled tasks that are due."""
        for job_id in await self.record.run_in_session(self.leases.claim_stranded):
            self._spawn(job_id, self.backends.reconcile)
        claims = partial(self.leases.claim_pending_jobs, at_most=CLAIMS_PER_TURN)
        for pending_id in await self.record.run_in_session(claims):
            self._spawn(pending_id, self.backends.run)
        await self.scheduled.tick(woken=self._bell.take())

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("job runner tick failed")
            await self._bell.wait(self.settings.poll_interval_s)

    def _spawn(self, job_id: str, work: Callable[[str], Awaitable[None]]) -> None:
        async def guarded() -> None:
            renew = asyncio.create_task(self._renew_lease(job_id, asyncio.current_task()))
            try:
                await work(job_id)
            except (asyncio.CancelledError, JobMovedOn):
                pass
            except Exception:
                log.exception("job %s: runner crashed", job_id)
            finally:
                renew.cancel()
                self._running.pop(job_id, None)
                self.leases.set_running(self._running)

        self._running[job_id] = asyncio.create_task(guarded(), name=f"job-{job_id}")
        self.leases.set_running(self._running)

    async def _renew_lease(self, job_id: str, worker: asyncio.Task[None] | None) -> None:
        while True:
            await asyncio.sleep(self.leases.lease_s / 3)
            try:
                held = await self.record.run_in_session(lambda s: self.leases.extend(s, job_id))
            except Exception:
                log.exception("job %s: lease renewal failed", job_id)
                continue
            if not held:
                log.warning("job %s: lease lost to another coordinator; stopping", job_id)
                if worker is not None:
                    worker.cancel()
                return
