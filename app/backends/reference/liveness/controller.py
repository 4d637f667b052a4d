"""The reference engines' liveness controller: one pass per deployment, run by the reference backend's
`periodic()` every `EPCTL_RUNNER_HEARTBEAT_CHECK_INTERVAL_S`, and once more at start with what the
members answered (`adoption`).

    observe   the views of every reference deployment (`observe.views`), then the probes as a separate
              observation step: `/healthz` of the engines still recorded on a broken generation
              (`judge.probe_targets`, `probes.process_gone`); the heartbeats' reports of engines stuck
              in a serving collective (`app.core.stuck`), and the probe of a freeze suspect
              (`judge.freeze_suspects`, `probes.reply_of`), which runs in the background and wakes the
              pass with its reply (issue 39)
    judge     one pure verdict per view and `now` (`judge.judge`)
    act       each verdict through the one writers, if the record is still what was seen (`act.act`);
              the engines written off are stopped by their launchers; the members waiting on a fenced
              frozen one are told to leave its group (`leave.tell_to_leave`)

What it remembers between passes (in memory, this coordinator's): when it started watching (silence
counts from then), when it last heard no engine at all, and since when each deployment has not been
whole (the health confirmation).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session

from app.agents.fleet import Fleet
from app.backends.reference.liveness import observe
from app.backends.reference.liveness.act import Acted, act, write_adopted, write_adopting
from app.backends.reference.liveness.adoption import Adoption, adoption_of, ask_members
from app.backends.reference.liveness.judge import freeze_suspects, judge, probe_targets
from app.backends.reference.liveness.leave import tell_to_leave
from app.backends.reference.liveness.probes import Probe, Reply_of, process_gone, reply_of
from app.backends.reference.liveness.quiet import WATCHED, quiet_until
from app.backends.reference.liveness.verdict import Leave, Verdict
from app.backends.reference.liveness.view import DeploymentView, Probed, Rules
from app.core import changes, wake
from app.core.clock import utc_now
from app.core.shedding import SHED_HEARTBEATS, ShedHeartbeats
from app.core.stuck import STUCK, StuckReports
from app.deployments.agent_keys import agent_keys_of
from app.deployments.models import Deployment, DeploymentStatus
from app.jobs.async_record import WorkerSessions
from app.launchers.base import EngineHandle, Launcher

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


@dataclass
class Pass:
    """What one pass did, per deployment (for tests and the log)."""

    verdicts: dict[str, Verdict] = field(default_factory=dict)
    acted: dict[str, Acted] = field(default_factory=dict)

    @property
    def jobs(self) -> list[str]:
        return [a.job_id for a in self.acted.values() if a.job_id is not None]

    @property
    def released(self) -> list[str]:
        return [h.engine_id for a in self.acted.values() for hs in a.released.values() for h in hs]


class Liveness:
    def __init__(
        self,
        record: WorkerSessions,
        launchers: Mapping[str, Launcher],
        rules: Rules,
        *,
        probe: Probe = process_gone,
        clock: Clock = utc_now,
        watching_since: datetime | None = None,
        shed: ShedHeartbeats = SHED_HEARTBEATS,
        stuck: StuckReports = STUCK,
        reply: Reply_of = reply_of,
        new_fleet: Callable[[], Fleet] | None = None,
    ) -> None:
        self.shed = shed
        self.stuck = stuck
        self.reply = reply
        self.new_fleet = new_fleet  # None: the survivors of a frozen member leave at the serving deadline
        self.probed: dict[str, Probed] = {}  # freeze suspects probed (engine id -> start and reply)
        self._background: set[asyncio.Task[None]] = set()  # suspects' probes, leave notices
        self.record = record
        self.launchers = launchers
        self.rules = rules
        self.probe = probe
        self.clock = clock
        self.watching_since = watching_since or clock()
        self.deaf_at: datetime | None = None
        self.broken_since: dict[str, datetime] = {}
        self._adoption: asyncio.Task[list[Adoption]] | None = None
        # The deployments an adoption in progress here judges (`adopting`): no pass writes them meanwhile.
        self._adopting: set[str] = set()
        self._stopping: set[asyncio.Task[None]] = set()  # written-off engines being stopped
        # Resting (`quiet`): until when the last full pass's fleet stays quiet by time alone (None: not
        # quiet), the change count it read at, when it ran (monotonic); passes skipped (for tests).
        self._quiet_until: datetime | None = None
        self._seen = -1
        self._full_at = float("-inf")
        self.skipped = 0

    async def tick(self) -> Pass:
        """One pass over every reference deployment, or none while the fleet rests (`quiet`)."""
        count, started = changes.CHANGES.count(WATCHED), time.monotonic()
        if self._rests(count, started):
            self.skipped += 1
            return Pass()
        views = await self.record.run_in_session(self._observe)
        views = await self._probed([v for v in views if v.id not in self._adopting])
        views = self._suspects(views)
        found = await self._judge_and_act(views)
        verdicts = [found.verdicts[v.name] for v in views if v.name in found.verdicts]
        self._quiet_until = quiet_until(views, verdicts, self.rules) if len(verdicts) == len(views) else None
        self._seen, self._full_at = count, started
        return found

    def _rests(self, count: int, now: float) -> bool:
        """Whether this pass may be skipped: the last full one found the fleet quiet, nothing this process
        wrote has moved the record it reads since, no deadline of the silence rules has come, nothing is
        in flight here (probes, adoption), and the last full pass is less than `FULL_PASS_EVERY_S` old
        (another coordinator's writes are not counted here)."""
        return (
            self._quiet_until is not None
            and count == self._seen
            and now - self._full_at < changes.FULL_PASS_EVERY_S
            and self.clock() < self._quiet_until
            and not self.probed
            and not self._adopting
            and self.shed.newest() is None
            and not self.stuck.snapshot()
        )

    def _suspects(self, views: list[DeploymentView]) -> list[DeploymentView]:
        """Start the probe of each new freeze suspect (in the background: its reply wakes the pass);
        the views show it pending."""
        now = self.clock()
        self.stuck.prune(now - timedelta(seconds=self.rules.heartbeat_timeout_s))
        for engine_id in [k for k, v in self.probed.items() if v.started_at < now - timedelta(minutes=1)]:
            del self.probed[engine_id]
        stuck = self.stuck.snapshot()
        seen = [observe.with_stuck(v, stuck, self.probed) for v in views]
        started = False
        for view in seen:
            for engine in freeze_suspects(view):
                self.probed[engine.id], started = Probed(now), True
                self._spawn(self._probe_suspect(engine.id, engine.url, now), "probe-freeze-suspect")
        return [observe.with_stuck(v, stuck, self.probed) for v in views] if started else seen

    async def _probe_suspect(self, engine_id: str, url: str, started_at: datetime) -> None:
        reply = await self.reply(url)
        if self.probed.get(engine_id, Probed(started_at)).started_at == started_at:
            self.probed[engine_id] = Probed(started_at, reply)
        log.warning("freeze suspect %s probed: %s", engine_id, reply.value)
        wake.ring(wake.LIVENESS)

    def _spawn(self, work: Any, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _tell(self, deployment_id: str, leave: Leave) -> None:
        if self.new_fleet is not None:
            self._spawn(tell_to_leave(self.record, self.new_fleet, deployment_id, leave), "tell-to-leave")

    def _observe(self, session: Session, *, only_without_a_job: bool = False) -> list[DeploymentView]:
        # The heartbeats this coordinator shed while saturated count as heard (`app.core.shedding`).
        self.shed.prune(self.clock() - timedelta(seconds=self.rules.heartbeat_timeout_s))
        heard = observe.hearing(
            session, watching_since=self.watching_since, deaf_at=self.deaf_at, newest_shed=self.shed.newest()
        )
        return observe.views(
            session,
            heard,
            self.broken_since,
            only_without_a_job=only_without_a_job,
            shed=self.shed.snapshot(),
        )

    async def _probed(self, views: list[DeploymentView]) -> list[DeploymentView]:
        targets = [(view.id, engine.id, engine.url) for view in views for engine in probe_targets(view)]
        if not targets:
            return views
        answers = await asyncio.gather(*(self.probe(url) for _, _, url in targets))
        gone: dict[str, dict[str, bool]] = {}
        for (view_id, engine_id, _), answer in zip(targets, answers, strict=True):
            gone.setdefault(view_id, {})[engine_id] = answer
        return [observe.with_probes(view, gone.get(view.id, {})) for view in views]

    async def _judge_and_act(self, views: list[DeploymentView]) -> Pass:
        now = self.clock()
        found = Pass()
        deaf = False
        for view in views:
            verdict = judge(replace(view, broken_since=self.broken_since.get(view.id)), now, self.rules)
            found.verdicts[view.name] = verdict
            deaf = deaf or verdict.deaf
            if verdict.writes_nothing and verdict.broken_since == self.broken_since.get(view.id):
                # Nothing to write and no memory to move: no worker thread, no transaction (issue 37:
                # 128 deployments every second, each one a thread hop, two reads and a commit before).
                found.acted[view.name] = Acted(verdict.deployment, applied=True)
                continue
            acted = await self.record.run_in_session(
                functools.partial(act, view=view, verdict=verdict, now=now)
            )
            found.acted[view.name] = acted
            if acted.applied and verdict.leave is not None:
                self._tell(view.id, verdict.leave)
            if acted.applied and view.current_dp_size > 0:  # `health`'s, or a job's (`serving_in_a_job`)
                if verdict.broken_since is None:
                    self.broken_since.pop(view.id, None)
                else:
                    self.broken_since[view.id] = verdict.broken_since
            self._release(acted)
        if deaf:
            self.deaf_at = now
        return found

    def _release(self, acted: Acted) -> None:
        """Stop the engines written off (a frozen one never returns), through their launchers, in the
        background: a stop waits out its grace (SIGTERM, then SIGKILL), and the runner's tick, which
        claims the self-heal job this same pass asked for, must not wait for it (3 s, issue 34)."""
        for launcher_name, handles in acted.released.items():
            launcher = self.launchers.get(launcher_name)
            if launcher is None:
                continue
            task = asyncio.create_task(_stop_lost(launcher, handles), name="stop-lost-engines")
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    # --- adoption ------------------------------------------------------------------------------------

    def start_adoption(self, new_fleet: Callable[[], Fleet]) -> None:
        self._adoption = asyncio.create_task(self._adopt(new_fleet), name="adoption")

    async def adoption(self, new_fleet: Callable[[], Fleet] | None = None) -> list[Adoption]:
        """What the start-up adoption found (waits for it), or with `new_fleet` a new one now (a
        deployment a job ran at start was left to that job); [] when none ran or it failed."""
        if self._adoption is None:
            return []
        found = await asyncio.shield(self._adoption)
        return await self._adopt(new_fleet) if new_fleet is not None else found

    async def adopted_within(self, timeout_s: float) -> bool:
        """Wait for the start-up adoption at most `timeout_s` (it runs on past that); whether it ended."""
        if self._adoption is None:
            return True
        done, _ = await asyncio.wait({self._adoption}, timeout=timeout_s)
        return bool(done)

    async def stop(self) -> None:
        if self._adoption is not None:
            self._adoption.cancel()
            await asyncio.gather(self._adoption, return_exceptions=True)

    async def _adopt(self, new_fleet: Callable[[], Fleet]) -> list[Adoption]:
        try:
            async with new_fleet() as fleet:
                return await self.adopt(fleet)
        except Exception:
            log.exception("adopting the recorded engines failed (the heartbeats will tell)")
            return []

    async def adopt(self, fleet: Fleet) -> list[Adoption]:
        """Ask every recorded member of the deployments no job runs, then one pass with the answers. Each
        one that says it serves reads `adopting` until then (`act.write_adopting`); the adoption alone
        judges it meanwhile, the periodic pass resumes after."""
        views = await self.record.run_in_session(lambda s: self._observe(s, only_without_a_job=True))
        views = [v for v in views if v.current_dp_size > 0]
        marked = await self.record.run_in_session(lambda s: write_adopting(s, views, self.clock()))
        self._adopting.update(marked)
        try:
            adopting = DeploymentStatus.adopting.value
            views = [replace(v, status=adopting) if v.id in marked else v for v in views]
            keys = await self.record.run_in_session(lambda s: _keys(s, views))
            answers = await ask_members(views, fleet, keys)
            adoptions = [adoption_of(view, answers.get(view.id, {})) for view in views]
            unsure = [
                observe.with_answers(v, answers.get(v.id, {}))
                for v, a in zip(views, adoptions, strict=True)
                if not a.adopted
            ]
            if unsure:
                await self._judge_and_act(unsure)
            whole = [v.id for v, a in zip(views, adoptions, strict=True) if a.adopted and v.id in marked]
            await self.record.run_in_session(lambda s: write_adopted(s, whole, self.clock()))
        finally:
            self._adopting.difference_update(marked)
        for adoption in adoptions:
            if adoption.adopted:
                log.warning("adopted deployment %s as it runs: %s", adoption.deployment, adoption.summary())
            else:
                log.warning("deployment %s not whole at start: %s", adoption.deployment, adoption.summary())
        return adoptions


def _keys(session: Session, views: list[DeploymentView]) -> dict[str, list[str]]:
    found = {}
    for view in views:
        deployment = session.get(Deployment, view.id)
        found[view.id] = list(agent_keys_of(deployment)) if deployment is not None else []
    return found


async def _stop_lost(launcher: Launcher, handles: list[EngineHandle]) -> None:
    try:
        await launcher.release_lost(handles)
    except Exception:
        log.exception("stopping lost engines %s failed", [h.engine_id for h in handles])
